"""The key every server this user launches on this host is given: made once, kept where only its owner reads it.

A launched server gets its key in its environment (never on its command line, which every user of the host can
read), under the arm's ``api_key_env``. The key is the same at every start, not a fresh one per start: vLLM
(0.26 at least) hashes every ``VLLM_*`` variable it does not list as irrelevant, ``VLLM_API_KEY`` among them,
into its torch.compile cache key, so a fresh key per start made every start compile its model again (15-20 s of
each start on an H200, against a cache read that takes a few seconds).  What keeps the key from other users is
the file's mode (0600, its directory 0700), checked at every read; deleting the file makes a new key at the next
start.

``$PAIRAUDIT_SERVER_KEY_FILE`` names the file; default ``$XDG_CONFIG_HOME/pairaudit/server-api-key``
(``~/.config/...``).
"""

from __future__ import annotations

import os
import secrets
import stat
import tempfile
from pathlib import Path

KEY_FILE_ENV = "PAIRAUDIT_SERVER_KEY_FILE"
MIN_KEY_CHARS = 32


class KeyFileError(RuntimeError):
    """The key file cannot be used; the message names the file and what to do."""


def key_file() -> Path:
    """Where the launch key lives: ``$PAIRAUDIT_SERVER_KEY_FILE``, else under the user's config directory."""
    raw = os.environ.get(KEY_FILE_ENV)
    if raw:
        return Path(raw).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "pairaudit" / "server-api-key"


def _create(path: Path) -> None:
    """Write a new key beside ``path`` and link it into place: a reader never sees half a key, and of two jobs
    making one at once the first link wins and both read it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".server-api-key-", dir=path.parent)   # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(secrets.token_urlsafe(32) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


def launch_key() -> str:
    """This user's launch key on this host, made on first use; refused when another user could read it."""
    path = key_file()
    if not path.exists():
        try:
            _create(path)
        except OSError as exc:
            raise KeyFileError(f"the server key file {path} cannot be made ({exc.strerror or exc}); set "
                               f"${KEY_FILE_ENV} to a path in a directory you own") from None
    st = path.stat()
    if st.st_uid != os.getuid():
        raise KeyFileError(f"the server key file {path} belongs to another user (uid {st.st_uid}); delete it, or set "
                           f"${KEY_FILE_ENV} to a file of your own")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(f"the server key file {path} is open to other users (mode {stat.S_IMODE(st.st_mode):o}): "
                           f"anyone who read it can use the audit's servers; delete it (a new key is made at the next "
                           f"start), or chmod 600 it if no one else could have")
    key = path.read_text(encoding="ascii", errors="replace").strip()
    if len(key) < MIN_KEY_CHARS or any(c.isspace() for c in key):
        raise KeyFileError(f"the server key file {path} does not hold a key (at least {MIN_KEY_CHARS} characters, "
                           "no spaces); delete it and a new one is made at the next start")
    return key
