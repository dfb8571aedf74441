"""The resolved arm spec: one typed record per arm, resolved once, read by every phase.

``resolve_spec`` validates an ``arms.<name>`` block and returns an
:class:`ArmSpec`; the ``arm_spec`` rule writes it to ``specs/<arm>.json``
(``ArmSpec.to_json`` under ``"spec"``) and every phase that starts or checks a
server reads it back from there (:func:`read_spec`) instead of resolving the
raw config again.  The spec file's sha256 is recorded in each phase's
provenance, so an edited or stale spec is refused like any other input.

Host-bound placeholders.  ``{python}``, ``{vllm_python}`` and ``{model_dir}``
are facts of the machine that *runs* the server (its interpreter, its vLLM
venv, its model cache), and on a cluster the node that starts a server need
not be the one that wrote the spec.  So the record keeps only the symbolic
``command_identity`` -- every other placeholder filled, these three and
``{port}`` kept as written -- and :meth:`ArmSpec.host_command` fills the three
on the host that calls it, at launch.  The identity hash never sees a host
path: moving a venv or a cache changes nothing about which server an arm is.

Arm config (YAML, under ``arms.<name>``)
----------------------------------------
launch mode: ``mode: launch``, ``command`` (list; placeholders ``{python}``,
``{vllm_python}``, ``{model}``, ``{model_dir}``, ``{served_model_name}``,
``{host}``, ``{port}``, ``{max_model_len}``), ``env`` (switches the arm adds, str/number values),
``host`` (default 127.0.0.1), ``port`` (0 = free port at start),
``health_timeout_s`` (default 300), ``stop_grace_s`` (default 15), ``model``,
``served_model_name`` (id in /v1/models; default ``model``),
``max_model_len``, ``speculative`` (bool, default false), ``model_sha256``
(optional pin, checked against /version's pairaudit block when present),
``gpus`` (default 0: no GPU asked; the GPUs its server takes from the host's
GPU pool, ``pairaudit.serving.gpupool``, and a cluster job's request).

attach mode: ``mode: attach``, ``url``, ``model``, optional
``served_model_name``, ``max_model_len`` (checked when given),
``speculative``, ``health_timeout_s`` (default 30), ``model_sha256``.

Either mode: ``api_key_env``, the environment variable that holds the arm's
API key (:func:`resolve_key_env`; ``serving.launch`` reads or makes the key,
sent as a bearer token and never recorded). Access, not identity: outside the
identity hash.

Spec (``resolve_spec``): an :class:`ArmSpec`, the config with defaults filled
and every placeholder resolved except the host-bound ones and ``{port}``;
resolved once per arm (at load and by the ``arm_spec`` rule) and read by the
phases from ``specs/<arm>.json``.
``gpus`` is scheduling, outside the identity hash (like ``host`` and ``port``).

``{vllm_python}`` is the project's vLLM interpreter (``$PAIRAUDIT_VLLM_PYTHON``,
else ``<repo>/.venv-vllm/bin/python``, installed by ``./install.sh --vllm``);
``{model_dir}`` a directory a real vLLM can load for ``model`` (the embedded
model's converted copy for its name, else ``model`` itself).
``command_identity`` keeps ``{python}``, ``{vllm_python}`` and ``{model_dir}``
symbolic: those paths are facts of the host's install (recorded under
``packages`` / ``server_packages``), not of the server being audited, so moving
a venv or the cache must not change the identity hash.  They are filled on the
host that launches the server (``ArmSpec.host_command``), which on a cluster
need not be the host that resolved the spec.

This module imports nothing that imports it back (``launch`` and ``versions``
build on it), which is why ``vllm_python`` and ``model_dir`` live here.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from pairaudit.core import artifacts
from pairaudit.core.artifacts import sha256_json
from pairaudit.core.contracts import ARM_SPEC_SCHEMA, arm_role
from pairaudit.core.settings import is_int, is_num, is_str  # the settings records check their fields alike
from pairaudit.serving import modelid

MODES = ("launch", "attach")
PLACEHOLDERS = ("python", "vllm_python", "model", "model_dir", "served_model_name", "host", "port",
                "max_model_len")
# Host-bound placeholders: their values are facts of this machine's install,
# kept symbolic in ``command_identity`` so moving a venv or a cache changes nothing.
HOST_PLACEHOLDERS = ("python", "vllm_python", "model_dir")
VLLM_PYTHON_ENV = "PAIRAUDIT_VLLM_PYTHON"
# The variables the launched servers read their API key from: the reference server's own, and vLLM's
# (VLLM_API_KEY, read when no --api-key is given). A launch arm of either gets one without configuring it.
REFSERVER_KEY_ENV = "PAIRAUDIT_REF_API_KEY"
VLLM_KEY_ENV = "VLLM_API_KEY"
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
REPO = Path(__file__).resolve().parents[2]
PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ArmSpecError(ValueError):
    """A spec record (or spec file) is not one ``ArmSpec.to_json`` wrote; the message names the key."""


def vllm_python() -> Path:
    """The interpreter of the project's vLLM venv: ``$PAIRAUDIT_VLLM_PYTHON``, else ``<repo>/.venv-vllm``."""
    env = os.environ.get(VLLM_PYTHON_ENV)
    return Path(env) if env else REPO / ".venv-vllm" / "bin" / "python"


def model_dir(model: str) -> str:
    """A directory a real vLLM can load for ``model``.

    The embedded model's converted copy (safetensors + tokenizer, built by
    ``install.sh``) for its name; any other value is passed through (a local
    directory or a hub id the server resolves itself). Only a path is
    computed here: nothing is hashed or converted at config time.
    """
    if model in (modelid.EMBEDDED_NAME, f"HuggingFaceTB/{modelid.EMBEDDED_NAME}"):
        return str(modelid.cache_root() / "models" / modelid.EMBEDDED_GGUF_SHA256)
    return model


def host_values(model: str) -> dict[str, str]:
    """This host's values of the host-bound placeholders, for an arm serving ``model``."""
    return {"python": sys.executable, "vllm_python": str(vllm_python()), "model_dir": model_dir(model)}


def fill_host(arg: str, values: Mapping[str, str]) -> str:
    """``arg`` with the host-bound placeholders filled; every other ``{name}`` (``{port}``) stays."""
    return PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)) if m.group(1) in HOST_PLACEHOLDERS
                              else m.group(0), arg)


@dataclass(frozen=True)
class ArmSpec:
    """One arm's server, resolved from its config (``resolve_spec``); immutable.

    ``command_identity`` and ``env`` are set for launch arms only, ``url`` for
    attach arms only; ``host``, ``port`` and ``stop_grace_s`` are launch-mode
    settings (None for attach).  ``gpus`` (how many GPUs a launched server
    takes from the machine's pool, ``serving.gpupool``) is scheduling, not the
    server: it is outside the identity hash, like ``host`` and ``port``.
    """
    arm: str
    mode: str                                   # "launch" | "attach"
    model: str
    served_model_name: str                      # the id /v1/models lists
    max_model_len: int | None                   # required in launch mode; checked when set
    speculative: bool
    model_sha256: str | None                    # optional pin, checked against the server's /version
    health_timeout_s: float
    command_identity: tuple[str, ...] | None = None  # host placeholders and {port} symbolic
    env: Mapping[str, str] = field(default_factory=dict)
    host: str | None = None
    port: int | None = None                     # 0 = a free port at each start
    stop_grace_s: float | None = None
    url: str | None = None
    gpus: int = 0
    api_key_env: str | None = None              # where the key is (attach) or goes (launch); never the key itself

    def __post_init__(self) -> None:
        # Frozen all the way down: a spec is shared by every start of a phase,
        # and a mutated env would quietly change what the identity hash covers.
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        if self.command_identity is not None:
            object.__setattr__(self, "command_identity", tuple(self.command_identity))

    # ------------------------------------------------------------ identity

    def identity(self) -> dict[str, Any]:
        """The fields that define which server an arm is; nothing host- or time-bound (the arm name neither)."""
        ident: dict[str, Any] = {"mode": self.mode, "model": self.model, "served_model_name": self.served_model_name,
                                 "max_model_len": self.max_model_len, "model_sha256": self.model_sha256}
        if self.mode == "launch":
            ident.update(command=list(self.command_identity or ()), env=dict(self.env))
        else:
            ident.update(url=self.url)
        return ident

    @property
    def spec_sha256(self) -> str:
        """The identity hash, as the launch receipt and the spec file record it."""
        return sha256_json(self.identity())

    # ---------------------------------------------------------------- host

    def host_command(self) -> list[str] | None:
        """The launch command on THIS host: host placeholders filled, ``{port}`` still symbolic; None for attach."""
        if self.command_identity is None:
            return None
        values = host_values(self.model)
        return [fill_host(a, values) for a in self.command_identity]

    # ---------------------------------------------------------------- JSON

    def to_json(self) -> dict[str, Any]:
        """The record as plain JSON (lists, dicts); ``from_json`` gives back an equal spec."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["env"] = dict(self.env)
        out["command_identity"] = list(self.command_identity) if self.command_identity is not None else None
        return out

    @classmethod
    def from_json(cls, doc: Any, *, where: str = "spec") -> ArmSpec:
        """Rebuild a spec from ``to_json``'s record; a missing, unknown or mistyped key is an ``ArmSpecError``."""
        if not isinstance(doc, Mapping):
            raise ArmSpecError(f"{where}: must be a mapping, got {type(doc).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(doc) - set(names))
        # a spec written before API keys has none: the same server, reached without a key
        missing = [n for n in names if n not in doc and n not in _OPTIONAL]
        if unknown or missing:
            raise ArmSpecError(f"{where}: keys differ from an arm spec's (missing: {missing or 'none'}, "
                               f"unknown: {unknown or 'none'}; allowed: {', '.join(names)})")
        for name, ok, what in _CHECKS:
            if not ok(doc.get(name)):
                raise ArmSpecError(f"{where}.{name}: {doc[name]!r} is not {what}")
        if doc["mode"] == "launch" and doc["command_identity"] is None:
            raise ArmSpecError(f"{where}.command_identity: required for a launch arm")
        cmd = doc["command_identity"]
        return cls(**{**doc, "command_identity": tuple(cmd) if cmd is not None else None,
                      "env": dict(doc["env"])})


def _opt(check):
    return lambda v: v is None or check(v)


_OPTIONAL = ("api_key_env",)


_CHECKS = (
    ("arm", is_str, "a string"),
    ("mode", lambda v: v in MODES, f"one of {', '.join(MODES)}"),
    ("model", is_str, "a string"),
    ("served_model_name", is_str, "a string"),
    ("max_model_len", _opt(is_int), "an integer or null"),
    ("speculative", lambda v: isinstance(v, bool), "true or false"),
    ("model_sha256", _opt(is_str), "a string or null"),
    ("health_timeout_s", is_num, "a number"),
    ("gpus", lambda v: is_int(v) and v >= 0, "a non-negative integer"),
    ("command_identity", _opt(lambda v: isinstance(v, (list, tuple)) and all(isinstance(a, str) for a in v)),
     "a list of strings or null"),
    ("env", lambda v: isinstance(v, Mapping) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()),
     "a mapping of strings"),
    ("host", _opt(is_str), "a string or null"),
    ("port", _opt(is_int), "an integer or null"),
    ("stop_grace_s", _opt(is_num), "a number or null"),
    ("url", _opt(is_str), "a string or null"),
    ("api_key_env", _opt(lambda v: is_str(v) and ENV_NAME_RE.fullmatch(v) is not None),
     "an environment variable name or null"),
)


# ------------------------------------------------------------ resolving an arm's config

# gpus: what the arm's jobs request from a cluster; scheduling, not the server's identity
LAUNCH_KEYS = ("mode", "command", "env", "host", "port", "health_timeout_s", "stop_grace_s", "model",
               "served_model_name", "max_model_len", "speculative", "model_sha256", "gpus", "api_key_env")
ATTACH_KEYS = ("mode", "url", "model", "served_model_name", "max_model_len", "speculative",
               "health_timeout_s", "model_sha256", "api_key_env")


def resolve_key_env(p: str, mode: str, given: Any, command: list | None) -> str | None:
    """The arm's ``api_key_env``: as configured, else for a launched reference server or vLLM the variable it
    reads its key from (every start of it then gets this user's launch key: pairaudit.serving.apikey), else
    None (no key)."""
    if given is not None:
        if not isinstance(given, str) or not ENV_NAME_RE.fullmatch(given):
            raise ConfigError(f"{p}.api_key_env: {given!r} is not an environment variable name")
        return given
    if mode != "launch":
        return None
    args = [str(a) for a in command or ()]
    if any("pairaudit.refserver" in a for a in args):
        return REFSERVER_KEY_ENV
    if any("vllm" in a.lower() for a in args):
        return VLLM_KEY_ENV
    return None

class ConfigError(ValueError):
    """An arm config is invalid; the message names the key and what is allowed."""


def _fill(arg: str, values: dict[str, str], where: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in values:
            raise ConfigError(f"{where}: unknown placeholder {{{name}}} "
                              f"(allowed: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})")
        return values[name]
    # Only {identifier} is a placeholder, so JSON arguments such as
    # --speculative-config '{"method": "ngram"}' pass through untouched.
    return PLACEHOLDER_RE.sub(sub, arg)


def resolve_spec(arm_name: str, arm_cfg: Mapping[str, Any]) -> ArmSpec:
    """Validate one ``arms.<name>`` block and return the resolved spec (``armspec.ArmSpec``)."""
    p = f"arms.{arm_name}"
    if not isinstance(arm_cfg, Mapping):
        raise ConfigError(f"{p}: must be a mapping, got {type(arm_cfg).__name__}")
    mode = arm_cfg.get("mode", "launch")
    if mode not in MODES:
        raise ConfigError(f"{p}.mode: {mode!r} is not one of {', '.join(MODES)}")
    allowed = LAUNCH_KEYS if mode == "launch" else ATTACH_KEYS
    for k in arm_cfg:
        if k not in allowed:
            raise ConfigError(f"{p}: unknown key {k!r} for mode {mode} (allowed: {', '.join(allowed)})")

    model = arm_cfg.get("model")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"{p}.model: required, a non-empty string")
    served = arm_cfg.get("served_model_name", model)
    if not isinstance(served, str) or not served:
        raise ConfigError(f"{p}.served_model_name: must be a non-empty string")
    mml = arm_cfg.get("max_model_len")
    if mml is None and mode == "launch":
        raise ConfigError(f"{p}.max_model_len: required in launch mode, a positive integer")
    if mml is not None and (not is_int(mml) or mml <= 0):
        raise ConfigError(f"{p}.max_model_len: {mml!r} is not a positive integer")
    spec_flag = arm_cfg.get("speculative", False)
    if not isinstance(spec_flag, bool):
        raise ConfigError(f"{p}.speculative: {spec_flag!r} is not one of true, false")
    sha = arm_cfg.get("model_sha256")
    if sha is not None and not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
        raise ConfigError(f"{p}.model_sha256: must be 64 lowercase hex digits")
    hto = arm_cfg.get("health_timeout_s", 300 if mode == "launch" else 30)
    if not is_num(hto) or hto <= 0:
        raise ConfigError(f"{p}.health_timeout_s: {hto!r} is not a positive number")

    base = ArmSpec(arm=arm_name, mode=mode, model=model, served_model_name=served, max_model_len=mml,
                   speculative=spec_flag, model_sha256=sha, health_timeout_s=float(hto))

    if mode == "attach":
        url = arm_cfg.get("url")
        if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+", url):
            raise ConfigError(f"{p}.url: required in attach mode, an http:// or https:// URL")
        return replace(base, url=url.rstrip("/"), api_key_env=resolve_key_env(p, mode, arm_cfg.get("api_key_env"), None))

    host = arm_cfg.get("host", "127.0.0.1")
    if not isinstance(host, str) or not host:
        raise ConfigError(f"{p}.host: must be a non-empty string")
    port = arm_cfg.get("port", 0)
    if not is_int(port) or not 0 <= port <= 65535:
        raise ConfigError(f"{p}.port: {port!r} is not an integer in 0..65535 (0 = pick a free port)")
    grace = arm_cfg.get("stop_grace_s", 15)
    if not is_num(grace) or grace < 0:
        raise ConfigError(f"{p}.stop_grace_s: {grace!r} is not a non-negative number")
    gpus = arm_cfg.get("gpus", 0)
    if not is_int(gpus) or gpus < 0:
        raise ConfigError(f"{p}.gpus: {gpus!r} is not a non-negative integer (0 = no GPU asked)")
    env = arm_cfg.get("env") or {}
    if not isinstance(env, dict):
        raise ConfigError(f"{p}.env: must be a mapping of NAME: value")
    env_s: dict[str, str] = {}
    for k, v in env.items():
        if not isinstance(k, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise ConfigError(f"{p}.env: {k!r} is not a valid environment variable name")
        # YAML turns `on`/`true` into booleans; what string the server then sees
        # is ambiguous, so insist on the literal value instead of guessing.
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise ConfigError(f"{p}.env.{k}: {v!r} must be a string or number (quote booleans, e.g. \"1\")")
        env_s[k] = str(v)
    key_env = resolve_key_env(p, mode, arm_cfg.get("api_key_env"), cmd if isinstance(cmd := arm_cfg.get("command"),
                                                                                     list) else None)
    if key_env in env_s:
        # env is recorded in every receipt: a key there would be written down
        raise ConfigError(f"{p}.env.{key_env}: the arm's API key variable (api_key_env) must not be set in env, "
                          "which every receipt records; the audit sets it for each start")
    cmd = arm_cfg.get("command")
    if not isinstance(cmd, list) or not cmd:
        raise ConfigError(f"{p}.command: required in launch mode, a non-empty list of arguments")
    for i, a in enumerate(cmd):
        if isinstance(a, bool) or not isinstance(a, (str, int, float)):
            raise ConfigError(f"{p}.command[{i}]: {a!r} must be a string or number")
    values = {**host_values(model), "model": model, "served_model_name": served, "host": host, "port": "{port}",
              "max_model_len": str(mml)}
    # The record keeps the host-bound placeholders symbolic; ArmSpec.host_command
    # fills them on the host that launches the server.
    symbolic = {**values, **{k: "{" + k + "}" for k in HOST_PLACEHOLDERS}}
    identity = [_fill(str(a), symbolic, f"{p}.command[{i}]") for i, a in enumerate(cmd)]
    spec = replace(base, command_identity=tuple(identity), env=env_s, host=host, port=port,
                               stop_grace_s=float(grace), gpus=gpus,
                               api_key_env=key_env)
    # Filling the host placeholders in a second pass must give what one pass
    # gives; it would not if a value filled in the first (a model name) itself
    # spelled a host placeholder.
    direct = [_fill(str(a), values, f"{p}.command[{i}]") for i, a in enumerate(cmd)]
    if spec.host_command() != direct:
        bad = next(i for i, (a, b) in enumerate(zip(spec.host_command() or [], direct)) if a != b)
        raise ConfigError(f"{p}.command[{bad}]: a value filled into {cmd[bad]!r} itself contains a placeholder "
                          f"(allowed: model, served_model_name and host without {{...}})")
    return spec


# ------------------------------------------------------------ the spec file

def spec_doc(spec: ArmSpec, *, provenance: dict) -> dict[str, Any]:
    """The ``specs/<arm>.json`` document of one arm (written by the ``arm_spec`` rule)."""
    return {"schema": ARM_SPEC_SCHEMA, "arm": spec.arm, "spec": spec.to_json(), "spec_sha256": spec.spec_sha256,
            "provenance": provenance}


def read_spec(path: str | os.PathLike, *, arm: str | None = None) -> ArmSpec:
    """The arm spec a ``specs/<arm>.json`` file holds (its content hash checked), refused naming the file.

    ``arm``: the arm the caller expects, by name or, for ``candidate``, by role (a sweep's candidate arm is
    named by its change, ``contracts.arm_role``); a spec of another arm is refused.
    The recorded ``spec_sha256`` must be the record's own identity hash: a
    file written under other identity rules is refused rather than trusted.
    """
    doc = artifacts.check_schema(artifacts.read_json(path), ARM_SPEC_SCHEMA, path)
    try:
        spec = ArmSpec.from_json(doc.get("spec"), where=f"{path}: spec")
    except ArmSpecError as exc:
        raise artifacts.ArtifactError(str(exc)) from None
    if arm is not None and spec.arm != arm and arm_role(spec.arm) != arm:
        raise artifacts.ArtifactError(f"{path}: the spec of arm {spec.arm!r}, expected arm {arm!r}")
    if doc.get("spec_sha256") != spec.spec_sha256:
        raise artifacts.ArtifactError(f"{path}: spec_sha256 {doc.get('spec_sha256')} is not the identity hash "
                                      f"{spec.spec_sha256} of its spec; rerun the arm_spec rule")
    return spec
