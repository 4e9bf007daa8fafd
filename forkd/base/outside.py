"""Temporaries outside the home: a file forkd writes where its user chose (a pack's output file, a file:// hub's
pack) is written under an owned name beside its destination (forkd.base.owners) and renamed over it when complete,
so the destination never holds a half-written file. A crash would leave that temporary where no sweep of the home
looks; so before making it, its maker writes a note in the home's tmp/ naming it, and removes the note once the
temporary is renamed or removed. A note whose maker is gone leads `forkd gc` (and the daemon's start-up recovery,
and the next write of this kind) to the temporary, which it removes with the note.

    noted_temporary(dest, tmp_dir) -> context manager yielding the temporary's path (the caller renames it)
    publish_outside(dest, tmp_dir) -> the same, renamed over `dest` when the block ends without an error
    sweep_outside(tmp_dir, dry_run=False) -> [Path]   dead makers' temporaries and notes (removed unless dry_run)

A note is trusted no further than it can be checked: it lies in the private tmp/, names an absolute path whose
last component is an owned name of the note's own maker, and only a regular file of forkd's user (not a link)
found there is removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from forkd.base.atomic import rename_into_place, write_bytes
from forkd.base.owners import owned_name, owner_of
from forkd.base.private import ensure_private_dir

NOTE_PREFIX = "outside"
MAX_NOTE_BYTES = 8192


@contextlib.contextmanager
def noted_temporary(dest: Path, tmp_dir: Path) -> Iterator[Path]:
    """Yield a new temporary's path beside `dest` (nothing there yet), noted in `tmp_dir` (a private directory of
    the home); the caller renames it into place (rename_into_place) or not; whatever is left of it goes with the
    note when the block ends. Dead makers' temporaries noted in `tmp_dir` go first."""
    dest, tmp_dir = Path(dest).absolute(), ensure_private_dir(Path(tmp_dir))
    sweep_outside(tmp_dir)
    tmp = dest.with_name(owned_name(f".{dest.name}.tmp"))
    note = tmp_dir / owned_name(NOTE_PREFIX)
    write_bytes(note, (json.dumps({"path": str(tmp)}) + "\n").encode(), mode=0o600)
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)
        note.unlink(missing_ok=True)


@contextlib.contextmanager
def publish_outside(dest: Path, tmp_dir: Path) -> Iterator[Path]:
    """noted_temporary, renamed over `dest` (fsynced first) when the block ends without an error."""
    with noted_temporary(dest, tmp_dir) as tmp:
        yield tmp
        rename_into_place(tmp, dest)


def sweep_outside(tmp_dir: Path, dry_run: bool = False) -> list[Path]:
    """The temporaries named by notes in `tmp_dir` whose maker is gone, and those notes: removed (unless
    `dry_run`) and returned. A temporary already gone (renamed into place, or removed) returns its note alone."""
    found: list[Path] = []
    try:
        it = os.scandir(tmp_dir)
    except (FileNotFoundError, NotADirectoryError):
        return found
    with it:
        notes = [Path(e.path) for e in it if e.name.startswith(f"{NOTE_PREFIX}-") and e.is_file(follow_symlinks=False)]
    for note in notes:
        owner = owner_of(note.name)
        if owner is None or owner.alive():
            continue
        target = _noted(note)
        if target is not None and _remove_regular(target, dry_run):
            found.append(target)
        if not dry_run:
            note.unlink(missing_ok=True)
        found.append(note)
    return found


def _noted(note: Path) -> Path | None:
    """The temporary a note names, if the note is well formed and names one made by the note's own maker."""
    try:
        fd = os.open(note, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            raw = json.loads(os.read(fd, MAX_NOTE_BYTES))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None
    path = raw.get("path") if isinstance(raw, dict) else None
    if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
        return None
    target = Path(path)
    if owner_of(target.name) is None or owner_of(target.name) != owner_of(note.name):
        return None
    return target


def _remove_regular(path: Path, dry_run: bool) -> bool:
    """Remove `path` if it is a regular file of this user (a link is never followed); True if it was there."""
    try:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.stat(path.name, dir_fd=dfd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return False
        if not dry_run:
            os.unlink(path.name, dir_fd=dfd)
        return True
    except OSError:
        return False
    finally:
        os.close(dfd)
