"""How a branch captures its source, decided as data: `plan_branch(mode, live_capture, probe) -> Strategy`, pure
and table-tested (tests/test_branch_plan.py). No I/O here: the probe is what `probe_source`
(forkd.core.pipeline.branch_paged) learned about the source before anything is written or paused.

Captures: `pages` (the pages the source wrote since its restore and its device state, sealed self-contained:
forkd.core.pipeline.branch_paged), `write-protect` (the VMM's live capture: forkd.core.pipeline.branch), `stop`
(mode full: paused for the whole copy), `diff` (a chain layer over the source's snapshot:
forkd.core.pipeline.branch_diff).

A live branch is taken by pages unless FORKD_BRANCH_LIVE_CAPTURE=write-protect, or the probe says why not (then
by write-protect, the reason kept as the result's `capture_note`; with FORKD_BRANCH_LIVE_CAPTURE=pages: refused).
"""

from __future__ import annotations

from dataclasses import dataclass

PAGE = 4096
# The pause of a pages capture grows with the pages written, QEMU's write-protect pause with the whole RAM
# (bench/branch.py's report has the figures): past 1/PAGES_PER_WRITTEN of RAM written, write-protect pauses less.
PAGES_PER_WRITTEN = 40
CAPTURES = ("pages", "write-protect", "stop", "diff")


@dataclass(frozen=True)
class Probe:
    """What is known about a live branch's source before anything is written or paused."""

    has_disk: bool
    memory_mib: int
    pages_problem: str | None = None  # why its written pages cannot be taken here (host, VMM, count failed)
    written_pages: int | None = None
    agent_busy: str | None = None  # another client holds its agent: why


@dataclass(frozen=True)
class Strategy:
    capture: str  # one of CAPTURES
    note: str | None = None  # a live branch not taken by pages: why (the result's capture_note)
    not_paged: str | None = None  # the same, when pages were tried (said again if write-protect is refused too)
    refusal: tuple[str, str] | None = None  # (message, hint): refused before anything is written


def needs_probe(mode: str, live_capture: str) -> bool:
    """Whether `plan_branch` needs a probe of the source (a live branch that may be taken by pages)."""
    return mode == "live" and live_capture != "write-protect"


def plan_branch(child_id: str, mode: str, live_capture: str, probe: Probe | None) -> Strategy:
    """The capture of a branch of `child_id` in `mode` (live | full | diff) under FORKD_BRANCH_LIVE_CAPTURE
    `live_capture` (auto | pages | write-protect), given what `probe` says of the source."""
    if mode == "diff":
        return Strategy("diff")
    if mode != "live":
        return Strategy("stop")
    if not needs_probe(mode, live_capture):
        return Strategy("write-protect", note="FORKD_BRANCH_LIVE_CAPTURE=write-protect")
    if probe is None:
        raise ValueError("a live branch that may be taken by pages needs a probe of its source")
    why = why_not_pages(probe, strict=live_capture == "pages")
    if why is None:
        return Strategy("pages")
    if live_capture == "pages":
        return Strategy("pages", refusal=(f"child {child_id} cannot be branched live by pages: {why}",
                                          "FORKD_BRANCH_LIVE_CAPTURE=auto takes the VMM's write-protect capture "
                                          "then"))
    return Strategy("write-protect", note=why, not_paged=why)


def why_not_pages(probe: Probe, strict: bool) -> str | None:
    """Why this source is not taken by pages, or None. `strict` (FORKD_BRANCH_LIVE_CAPTURE=pages): however many
    pages it wrote."""
    if probe.has_disk:
        return "the child has a disk (its overlay is copied while the guest's filesystem is frozen)"
    if probe.pages_problem is not None:
        return probe.pages_problem
    most = (probe.memory_mib << 20) // PAGE // PAGES_PER_WRITTEN
    if probe.written_pages is not None and probe.written_pages > most and not strict:
        return (f"it wrote {probe.written_pages} pages since its restore, more than 1/{PAGES_PER_WRITTEN} of its "
                f"RAM ({most}): a pause by pages would pass the VMM's")
    if probe.agent_busy is not None:
        return f"its agent is held by another client ({probe.agent_busy})"
    return None
