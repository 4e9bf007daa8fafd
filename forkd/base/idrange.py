"""The uid/gid range VMMs drop to, and the check that no other tenant of this host is given ids in it.

Under FORKD_VMM_RUNAS=per-child every VMM runs as a uid:gid of its own from [FORKD_VMM_UID_BASE, +COUNT): the lower
half for children (derived from the child id, so a restarted daemon finds it again), the upper half for build VMMs
(random). A child id is public, so its uid is too: if the host hands subordinate ids in that range to someone else
(/etc/subuid, /etc/subgid: LXD/Incus, rootless podman, `systemd-nspawn -U`, pods with `hostUsers: false`), a
process contained there could hold a VMM's uid and signal or ptrace it. forkd refuses to start a VMM that drops to
a range overlapping either file, naming the line; `forkd doctor` says the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from forkd.base.errors import InvalidInput

SUBID_FILES = (Path("/etc/subuid"), Path("/etc/subgid"))
MAX_SUBID_BYTES = 1 << 20  # a subordinate-id file larger than this is not read whole


@dataclass(frozen=True)
class SubIds:
    """One line of /etc/subuid or /etc/subgid: `owner:start:count`."""

    source: str
    line: int
    owner: str
    start: int
    count: int

    def overlaps(self, start: int, count: int) -> bool:
        return self.start < start + count and start < self.start + self.count


def parse_subids(text: str, source: str) -> list[SubIds]:
    """The ranges of a subordinate-id file; comments, blank and malformed lines are skipped (shadow-utils does)."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        fields = raw.strip().split(":")
        if len(fields) != 3 or raw.lstrip().startswith("#"):
            continue
        try:
            start, count = int(fields[1]), int(fields[2])
        except ValueError:
            continue
        if start >= 0 and count > 0:
            out.append(SubIds(source, n, fields[0], start, count))
    return out


def clashes(start: int, count: int, files: tuple[Path, ...] = SUBID_FILES) -> list[SubIds]:
    """The subordinate-id ranges of `files` that overlap [start, start + count) (a missing file holds none)."""
    found = []
    for path in files:
        try:
            with open(path, "rb") as f:
                text = f.read(MAX_SUBID_BYTES).decode(errors="replace")
        except FileNotFoundError:
            continue
        found += [r for r in parse_subids(text, str(path)) if r.overlaps(start, count)]
    return found


def check_free(start: int, count: int, files: tuple[Path, ...] = SUBID_FILES) -> None:
    """Raise InvalidInput naming the first overlapping line if the VMM range is also given out as subordinate ids."""
    bad = clashes(start, count, files)
    if bad:
        r = bad[0]
        raise InvalidInput(
            f"the VMM uid range [{start}, {start + count}) overlaps {r.source} line {r.line} ({r.owner}: "
            f"[{r.start}, {r.start + r.count})): a process in that user namespace could signal or ptrace a VMM",
            hint="set FORKD_VMM_UID_BASE (and FORKD_VMM_UID_COUNT) to a range no subordinate-id file hands out, "
                 "e.g. above every range in /etc/subuid and /etc/subgid")


def vmm_range() -> tuple[int, int]:
    """(base, count) of the VMM uid range from the settings, checked against the subordinate-id files."""
    from forkd.base.settings import settings

    base, count = settings().vmm_uid_base, settings().vmm_uid_count
    if base + count > (1 << 32) - 1:
        raise InvalidInput(f"FORKD_VMM_UID_BASE + FORKD_VMM_UID_COUNT = {base + count} reaches uid 2^32 - 1",
                           hint="lower either so the range ends below 4294967295")
    check_free(base, count, SUBID_FILES)
    return base, count


def child_uid(child_id: str, base: int, count: int) -> int:
    """The uid (= gid) of a child's VMM: from the lower half of the range, by the child id's hex digits."""
    half = count // 2
    return base + int(child_id.lstrip("c")[:7] or "0", 16) % half


def build_uid(base: int, count: int) -> int:
    """A random uid (= gid) for a build VMM, from the upper half of the range."""
    half = count // 2
    return base + half + int.from_bytes(os.urandom(4), "big") % (count - half)
