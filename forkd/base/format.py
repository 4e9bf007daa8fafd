"""The on-disk format of a $FORKD_HOME: its version, in $FORKD_HOME/format.json ({"version": N}), and the steps
that bring an older home up to the version this code writes.

Version 1 is the layout forkd had before the file existed: a home with content but no format.json. Opening a home
(`open_home`, called by Layout.ensure) stamps a new, empty one with CURRENT, migrates an older one step by step
under the home's lock, and refuses one stamped with a version newer than CURRENT: a forkd must not write into a
layout it does not know.

To change the layout, append a step to MIGRATIONS: it takes a home of version N to N + 1 and must be idempotent,
because a crash during a step re-runs that step on the next start (the version is stamped only after a step has
finished). CURRENT follows from the table. tests/test_upgrade.py opens a home made by the previous release.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from forkd.base.atomic import write_json
from forkd.base.errors import Conflict, ForkdError, InvalidInput
from forkd.base.locks import file_lock

FILE_NAME = "format.json"
LOCK_NAME = ".lock"  # the home's lock: held while a home is stamped or migrated
FIRST = 1  # the version of a home without format.json
_REPAIR = ('write {"version": N} into it, N being the format version of the forkd that wrote this home '
           f"(1 for a home from before {FILE_NAME} existed), or move the home aside")


def _v1_to_v2(home: Path) -> None:
    """Version 2 is version 1 plus format.json: the layout itself did not change, so there is nothing to move."""


def _v2_to_v3(home: Path) -> None:
    """Version 3 keys declarative objects by namespace: objects/<Kind>/<name>.json (and .events.jsonl) move to
    objects/<Kind>/default/. Idempotent: files already moved are not there to move again."""
    objects = home / "objects"
    if not objects.is_dir():
        return
    for kind in objects.iterdir():
        if kind.name.startswith(".") or not kind.is_dir() or kind.is_symlink():
            continue  # .claims (records keyed by qualified name: "default" ones keep their names) and .lock
        files = [p for p in kind.iterdir() if p.is_file() and not p.is_symlink()
                 and (p.name.endswith(".json") or p.name.endswith(".events.jsonl"))]
        if files:
            (kind / "default").mkdir(mode=0o700, exist_ok=True)
        for p in files:
            p.rename(kind / "default" / p.name)


# (version a step starts from, the step), in order: step N takes a home of version N to N + 1
MIGRATIONS: tuple[tuple[int, Callable[[Path], None]], ...] = (
    (1, _v1_to_v2),
    (2, _v2_to_v3),
)
CURRENT = MIGRATIONS[-1][0] + 1


def read_version(home: Path) -> int | None:
    """The version stamped in `home`; None when it has no format.json. Raises Conflict for a newer version than
    this code knows, InvalidInput for a file that is not {"version": <int>}, ForkdError for one it cannot read."""
    path = home / FILE_NAME
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ForkdError(f"{path} cannot be read ({exc})",
                         hint="check that FORKD_HOME is right and that forkd runs as the user owning it") from exc
    except ValueError as exc:
        raise InvalidInput(f"{path} is not JSON ({exc})", hint=_REPAIR) from exc
    version = doc.get("version") if isinstance(doc, dict) else None
    if type(version) is not int or version < FIRST:
        raise InvalidInput(f"{path}: \"version\" must be an integer of at least {FIRST}, not {version!r}",
                           hint=_REPAIR)
    if version > CURRENT:
        raise Conflict(f"{path} says this FORKD_HOME has format version {version}, but this forkd knows versions "
                       f"up to {CURRENT}: a newer forkd wrote it",
                       hint="upgrade forkd to the release that wrote this home (or set FORKD_HOME to another "
                            "directory); an older forkd must not write into it")
    return version


def open_home(home: Path) -> None:
    """Make `home` (created when missing) a home of version CURRENT: stamp a new one, migrate an older one, refuse
    a newer one. Cheap when the home is current: one small read, no lock."""
    if read_version(home) == CURRENT:
        return
    home.mkdir(parents=True, exist_ok=True)
    with file_lock(home / LOCK_NAME):  # another process may have stamped or migrated it meanwhile: read again
        version = read_version(home)
        if version is None and not any(p.name != LOCK_NAME for p in home.iterdir()):
            write_json(home / FILE_NAME, {"version": CURRENT})  # a new home
            return
        for start, step in MIGRATIONS:
            if start >= (version or FIRST):
                _run_step(home, start, step)


def _run_step(home: Path, start: int, step: Callable[[Path], None]) -> None:
    try:
        step(home)
    except (OSError, ForkdError) as exc:
        raise ForkdError(f"migrating {home} from format version {start} to {start + 1} failed: {exc}",
                         hint="fix the cause and run forkd again: the migration resumes at this step") from exc
    write_json(home / FILE_NAME, {"version": start + 1})
