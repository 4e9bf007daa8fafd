"""Keep a failed VM's logs where the error says they are.

A job's work directory (with the VMM's qemu.log and the guest's console.log) is removed when the job unwinds, so
an error naming a file in it would name a file that no longer exists. `keep_logs` copies the logs to
$FORKD_HOME/logs/<name>-<UTC time>-<pid>/ (private: 0700 / 0600; the newest KEEP such directories are kept)
and returns the error with the work directory's path replaced by the kept one."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from forkd.base.errors import ForkdError
from forkd.base.private import ensure_private_dir, make_private_dir

KEEP = 20
LOG_FILES = ("qemu.log", "console.log")


def _prune(logs: Path, prefix: str) -> None:
    kept = sorted((d for d in logs.iterdir() if d.name.startswith(prefix) and d.is_dir() and not d.is_symlink()),
                  key=lambda d: d.stat().st_mtime, reverse=True)
    for d in kept[KEEP:]:
        shutil.rmtree(d, ignore_errors=True)


def keep_logs(exc: ForkdError, work: Path, logs: Path, name: str) -> ForkdError:
    """Copy `work`'s logs under `logs` and return `exc` re-worded to name them (the same type, hint and all)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = make_private_dir(ensure_private_dir(logs) / f"{name}-{stamp}-{os.getpid()}")
    for f in LOG_FILES:
        src = work / f
        if src.is_file() and not src.is_symlink():
            with open(src, "rb") as r, open(os.open(dest / f, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                                   0o600), "wb") as w:
                shutil.copyfileobj(r, w)
    _prune(logs, name.split("-", 1)[0] + "-")
    message = exc.message.replace(str(work), str(dest))
    if message == exc.message:
        message += f"\nlogs kept in {dest}"
    kept = type(exc).__new__(type(exc))
    ForkdError.__init__(kept, message, exc.hint, status=exc.status, body=exc.body, url=exc.url)
    return kept
