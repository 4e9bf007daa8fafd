"""`forkd cp SRC DST` (like `docker cp`): one side is `ID:/path` in a sandbox, the other a host path or `-`.

* sandbox -> host: the guest makes a tar stream of the path; it must answer the question asked (one top entry,
  named as the path's last component: forkd.base.taranswer) or the copy fails and writes nothing. It is extracted
  with forkd.base.tarsafe (never outside DST, never through a link, bounded in bytes), or, for `-`, checked whole
  before any of it is written to stdout.
* host -> sandbox: a file is uploaded as a stream (atomic on the guest side); a directory is sent as a tar stream
  the guest extracts; `-` sends stdin, which must be a tar stream, into the guest directory.

Where DST exists and is a directory, SRC lands inside it under its own name; otherwise DST is SRC's new name
(its parent must exist)."""

from __future__ import annotations

import os
import re
import shutil
import sys
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from forkd.base import taranswer, tarsafe
from forkd.base.errors import InvalidInput, NotFound

LOCATION = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*):(.*)$")
CHUNK = 1 << 20


def parse_location(spec: str) -> tuple[str | None, str]:
    """(sandbox id, guest path) for `ID:/path`, (None, spec) for a host path or `-` (write a host path with a
    colon in it as ./a:b)."""
    m = LOCATION.match(spec)
    if not m or spec.startswith(("./", "/")):
        return None, spec
    path = m.group(2) or "/"
    if not path.startswith("/"):
        raise InvalidInput(f"{spec!r}: the path in the sandbox must be absolute", hint=f"{m.group(1)}:/{path}")
    return m.group(1), path


def copy(backend: Any, src: str, dst: str, stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None,
         max_bytes: int = 1 << 62) -> dict:
    (sid, spath), (did, dpath) = parse_location(src), parse_location(dst)
    if (sid is None) == (did is None):
        raise InvalidInput("forkd cp copies between a sandbox and this host: exactly one of SRC and DST is ID:/path",
                           hint="forkd cp ID:/etc/hosts ./hosts | forkd cp ./dir ID:/root/ | forkd cp ID:/x - > x.tar")
    if sid is not None:
        return from_guest(backend.files(sid), spath, dpath, stdout or sys.stdout.buffer, max_bytes)
    return to_guest(backend.files(did), spath, dpath, stdin or sys.stdin.buffer)


def _basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1] or "root"


def from_guest(files: Any, gpath: str, dst: str, stdout: IO[bytes], max_bytes: int) -> dict:
    top = taranswer.top_name(gpath)
    stream = files.tar_read(gpath)
    if dst == "-":
        return {"from": gpath, "to": "-", "bytes": _to_stdout(taranswer.answer_only(stream, top), stdout, max_bytes)}
    target = Path(dst)
    if target.is_dir():
        into, name = target, top
    elif dst.endswith("/"):
        raise NotFound(f"{dst} is not an existing directory", hint=f"create it first: mkdir -p {dst}")
    elif not target.parent.is_dir():
        raise NotFound(f"{target.parent} is not an existing directory")
    else:
        into, name = target.parent, target.name
    out = tarsafe.extract(stream, into, top, name, max_bytes=max_bytes)
    return {"from": gpath, "to": str(into / name), **out.to_dict()}


def _to_stdout(chunks: Iterator[bytes], stdout: IO[bytes], max_bytes: int) -> int:
    """Spool the checked stream to an unnamed file, then copy it out: a refused archive writes nothing to stdout."""
    n = 0
    with tempfile.TemporaryFile() as spool:
        for chunk in chunks:
            n += len(chunk)
            if n > max_bytes:
                raise InvalidInput(f"the archive holds over {max_bytes} bytes (the limit of this copy)",
                                   hint="raise it with --max-size if you expect that much")
            spool.write(chunk)
        spool.seek(0)
        shutil.copyfileobj(spool, stdout, CHUNK)
    stdout.flush()
    return n


def to_guest(files: Any, src: str, gpath: str, stdin: IO[bytes]) -> dict:
    if src == "-":
        n = files.tar_write(gpath, iter(lambda: stdin.read(CHUNK), b""))
        return {"from": "-", "to": gpath, "bytes": n}
    local = Path(src)
    if not local.exists() and not local.is_symlink():
        raise NotFound(f"{src} does not exist on this host")
    is_dir = files.exists(gpath) and files.stat(gpath).type == "dir"
    if local.is_file() and not local.is_symlink():
        target = gpath.rstrip("/") + "/" + local.name if is_dir else gpath
        with open(local, "rb") as f:
            n = files.write(target, f, mode=local.stat().st_mode & 0o777)
        return {"from": src, "to": target, "bytes": n}
    if is_dir:
        into, name = gpath, local.name
    else:
        into, name = gpath.rstrip("/").rsplit("/", 1)[0] or "/", _basename(gpath)
    n = files.tar_write(into, host_tar(local, name))
    return {"from": src, "to": into.rstrip("/") + "/" + name, "bytes": n}


def _no_owner(t: tarfile.TarInfo) -> tarfile.TarInfo:
    t.uid = t.gid = 0
    t.uname = t.gname = "root"
    return t


def host_tar(src: Path, arcname: str) -> Iterator[bytes]:
    """A tar stream of host path `src` (links stored as links, never followed), made by a thread into a pipe."""
    r, w = os.pipe()
    error: list[BaseException] = []

    def make() -> None:
        try:
            with os.fdopen(w, "wb") as f, tarfile.open(fileobj=f, mode="w|") as tar:
                tar.add(str(src), arcname=arcname, recursive=True, filter=_no_owner)
        except BaseException as exc:  # noqa: BLE001 - reported by the reader
            error.append(exc)

    t = threading.Thread(target=make, daemon=True)
    t.start()
    try:
        with os.fdopen(r, "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk
    finally:
        t.join()
    if error and not isinstance(error[0], BrokenPipeError):
        raise InvalidInput(f"reading {src} for the copy failed: {error[0]}")
