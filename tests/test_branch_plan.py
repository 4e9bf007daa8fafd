"""A branch's capture decided as data (forkd.core.pipeline.branch_plan.plan_branch, pure: no VM), the driver's
VmmLost type that tells a lost VMM from a failed operation, and the steps each capture brings (no VM: the job
is only built, never started)."""

from __future__ import annotations

import socket
import threading

import pytest

from forkd.core.branch import WAYS
from forkd.core.pipeline.branch_plan import PAGES_PER_WRITTEN, Probe, Strategy, needs_probe, plan_branch
from forkd.core.pipeline.branch_source import vmm_lost
from forkd.vmm.agent_client import AgentClient
from forkd.vmm.driver import VmmLost
from forkd.vmm.qmp import QMPDisconnected

MIB = 512
MOST = (MIB << 20) // 4096 // PAGES_PER_WRITTEN  # pages a 512 MiB source may have written to be taken by pages
QUIET = Probe(has_disk=False, memory_mib=MIB, written_pages=10)
DISK = Probe(has_disk=True, memory_mib=MIB)
NO_SCAN = Probe(has_disk=False, memory_mib=MIB, pages_problem="this kernel has no PAGEMAP_SCAN")
MANY = Probe(has_disk=False, memory_mib=MIB, written_pages=MOST + 1)
EDGE = Probe(has_disk=False, memory_mib=MIB, written_pages=MOST)
HELD = Probe(has_disk=False, memory_mib=MIB, written_pages=10, agent_busy="held by pid 7")


@pytest.mark.parametrize("mode,live_capture,probe,capture,note_has,refused", [
    ("diff", "auto", None, "diff", None, False),
    ("diff", "write-protect", None, "diff", None, False),  # the setting is about live branches only
    ("full", "auto", None, "stop", None, False),
    ("full", "pages", None, "stop", None, False),
    ("live", "write-protect", None, "write-protect", "FORKD_BRANCH_LIVE_CAPTURE=write-protect", False),
    ("live", "auto", QUIET, "pages", None, False),
    ("live", "auto", EDGE, "pages", None, False),  # exactly 1/PAGES_PER_WRITTEN of RAM: still pages
    ("live", "auto", MANY, "write-protect", f"1/{PAGES_PER_WRITTEN}", False),
    ("live", "auto", DISK, "write-protect", "has a disk", False),
    ("live", "auto", NO_SCAN, "write-protect", "PAGEMAP_SCAN", False),
    ("live", "auto", HELD, "write-protect", "agent is held", False),
    ("live", "pages", MANY, "pages", None, False),  # pages forced: however many it wrote
    ("live", "pages", HELD, "pages", None, True),  # ... but not a held agent: refused, not write-protect
    ("live", "pages", DISK, "pages", None, True),
])
def test_the_capture_of_a_branch(mode, live_capture, probe, capture, note_has, refused):
    plan = plan_branch("c1", mode, live_capture, probe)
    assert plan.capture == capture
    assert (plan.refusal is not None) is refused
    if note_has is None:
        assert plan.note is None
    else:
        assert note_has in plan.note
    if refused:
        assert plan.refusal[0].startswith("child c1 cannot be branched live by pages: ")
        assert "FORKD_BRANCH_LIVE_CAPTURE=auto" in plan.refusal[1]


def test_a_refused_write_protect_capture_says_why_not_pages_only_when_pages_were_tried():
    """`not_paged` (said again if write-protect is refused too) is set only by a fall-back from pages, never by
    FORKD_BRANCH_LIVE_CAPTURE=write-protect."""
    assert plan_branch("c1", "live", "auto", HELD).not_paged == plan_branch("c1", "live", "auto", HELD).note
    assert plan_branch("c1", "live", "write-protect", None).not_paged is None


@pytest.mark.parametrize("mode,live_capture,probed", [
    ("live", "auto", True), ("live", "pages", True), ("live", "write-protect", False),
    ("full", "auto", False), ("diff", "auto", False),
])
def test_only_a_live_branch_that_may_be_taken_by_pages_is_probed(mode, live_capture, probed):
    assert needs_probe(mode, live_capture) is probed
    if probed:
        with pytest.raises(ValueError, match="needs a probe"):
            plan_branch("c1", mode, live_capture, None)


def test_a_strategy_is_a_frozen_value():
    plan = Strategy("pages")
    with pytest.raises(AttributeError):
        plan.capture = "stop"  # type: ignore[misc]


def test_every_capture_has_its_steps():
    """Each capture a plan can name has a way in the job's table; diff and pages share the capture by pages
    (diff as a layer), write-protect and stop the VMM's stream."""
    assert set(WAYS) == {"pages", "diff", "write-protect", "stop"}
    pages, diff = WAYS["pages"](QUIET), WAYS["diff"](None)
    assert (pages.layer, pages.written, diff.layer, diff.written) == (False, 10, True, None)
    assert type(WAYS["write-protect"](None)) is type(WAYS["stop"](None))


def test_a_closed_agent_connection_is_a_lost_vmm(tmp_path):
    """A VMM that closes the agent's connection (it exited) makes the agent client raise VmmLost, the driver's
    type; QMP's lost connection is one too; the branch's fate check recognises it by type through a chain of
    causes, and a message that merely looks like one is not."""
    path = tmp_path / "agent.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def vmm_exits() -> None:
        conn, _ = server.accept()
        conn.recv(1 << 16)  # the request arrives, then the VMM is gone
        conn.close()

    t = threading.Thread(target=vmm_exits)
    t.start()
    client = AgentClient(path, connect_timeout=5)
    try:
        with pytest.raises(VmmLost) as lost:
            client.call("ping", timeout=5)
    finally:
        client.close()
        t.join(5)
        server.close()
    assert isinstance(QMPDisconnected("QMP query-status: connection lost"), VmmLost)
    try:
        try:
            raise lost.value
        except VmmLost as exc:
            raise RuntimeError("the capture failed") from exc
    except RuntimeError as wrapped:
        assert vmm_lost(wrapped)
    assert vmm_lost(BrokenPipeError()) and not vmm_lost(RuntimeError("QMPDisconnected (VMM exited?)"))


def test_background_conversions_belong_to_their_runtime():
    """A runtime waits for its own background conversions (wait=False branches), not another's."""
    from forkd.core.pipeline.branch import Conversions

    mine, other, release = Conversions(), Conversions(), threading.Event()
    done = threading.Event()
    t = threading.Thread(target=lambda: (release.wait(10), done.set()))
    t.start()
    mine.add(t)
    other.wait(0)  # nothing of its own: returns at once, the conversion still runs
    assert not done.is_set()
    release.set()
    mine.wait(10)
    assert done.is_set()
