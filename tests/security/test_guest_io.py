"""A slow or hostile guest against the daemon's guest-facing routes (SECURITY.md section 1): a listing of a tree the
guest shaped stays a bounded answer, page after page; a guest that stalls cannot take the threads the other routes
need. Real VMs, the real app."""

from __future__ import annotations

import base64
import json
import threading
import time

import httpx
import pytest
from starlette.testclient import TestClient

from forkd.api.app import create_app
from forkd.core.files import PAGE_BYTES
from forkd.reconciler.control import Control
from forkd.vmm.agent_files import MAX_PATH
from tests.test_api import start_api_daemon, stop_api_daemon

pytestmark = pytest.mark.vm

DEFAULT_POOL = 40  # threads of the server's default pool (anyio's default thread limiter)
LONG = 250  # bytes of each directory name of the chain
FILES_AT = 14  # the level of the directory that holds the many files


def deep_tree(levels: int) -> str:
    """Guest code: a chain of `levels` directories under /root/deep, 1500 files with long names at FILES_AT."""
    return f'''
import os
os.makedirs("/root/deep", exist_ok=True)
fd = os.open("/root/deep", os.O_RDONLY)
try:
    for level in range(1, {levels} + 1):  # made relative to the directory above (past PATH_MAX too), as a guest can
        os.mkdir("d" * {LONG}, dir_fd=fd)
        nfd = os.open("d" * {LONG}, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
        if level == {FILES_AT}:
            for j in range(1500):
                os.close(os.open(f"{{j:04d}}" + "f" * 196, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
finally:
    os.close(fd)
print("made")
'''


def expected_paths(levels: int) -> tuple[list[str], int]:
    """The entries a listing of /root/deep at depth 32 holds, depth first, and how many are too long to name."""
    out, skipped, d = [], 0, "/root/deep"
    for level in range(1, levels + 1):
        d = d + "/" + "d" * LONG
        if len(d) > MAX_PATH:
            skipped += 1  # not listed, and nothing beneath it
            break
        out.append(d)
        if level == FILES_AT:
            out += [f"{d}/{j:04d}" + "f" * 196 for j in range(1500)]
    return out, skipped


def list_all(api: TestClient, child: str) -> tuple[list[str], int, int]:
    """Every page of /root/deep at depth 32: (paths, skipped, pages); each page's body is bounded."""
    got, skipped, pages, cursor = [], 0, 0, None
    while True:
        params = {"path": "/root/deep", "depth": 32, **({"cursor": cursor} if cursor else {})}
        r = api.get(f"/v1/sandboxes/{child}/files/list", params=params)
        assert r.status_code == 200, r.text[:500]
        assert len(r.content) <= PAGE_BYTES + (64 << 10), len(r.content)  # bounded, whatever the tree
        page = json.loads(r.content)
        got += [e["path"] for e in page["entries"]]
        skipped += page["skipped"]
        pages += 1
        assert pages < 50, "the listing does not end"
        cursor = page["next_cursor"]
        if cursor is None:
            return got, skipped, pages


def test_a_deep_tree_the_guest_wrote_is_listed_in_bounded_pages(rt, fork):
    """Paths of ~3.7 KB, 1500 of them: one answer would be ~6 MB; pages of a bounded size hold them all."""
    [c] = fork(1)
    assert rt.exec_code(c.id, deep_tree(FILES_AT + 1))["stdout"] == "made\n"
    want, _ = expected_paths(FILES_AT + 1)
    with TestClient(create_app(Control(rt))) as api:
        got, skipped, pages = list_all(api, c.id)
        assert got == want and skipped == 0 and pages >= 2
        r = api.get(f"/v1/sandboxes/{c.id}/files/list", params={"path": "/root/deep", "depth": 32, "limit": 3})
        first = r.json()
        assert [e["path"] for e in first["entries"]] == want[:3]
        r = api.get(f"/v1/sandboxes/{c.id}/files/list",
                    params={"path": "/root/deep", "depth": 32, "cursor": first["next_cursor"], "limit": 2})
        assert [e["path"] for e in r.json()["entries"]] == want[3:5]
        for bad in ("%%%", "eC8uLi9ldGM=", "Zi4uL2V0Yw=="):  # not base64; not a kind; a component `..`
            r = api.get(f"/v1/sandboxes/{c.id}/files/list", params={"path": "/root/deep", "cursor": bad})
            assert r.status_code == 400 and "cursor" in r.json()["detail"], r.text


def test_a_tree_deeper_than_path_max_is_listed_up_to_it(rt, fork):
    """A chain the guest made past PATH_MAX: the listing answers, with every path at most MAX_PATH bytes, and
    counts what it left out."""
    [c] = fork(1)
    assert rt.exec_code(c.id, deep_tree(20))["stdout"] == "made\n"
    want, want_skipped = expected_paths(20)
    with TestClient(create_app(Control(rt))) as api:
        got, skipped, _ = list_all(api, c.id)
    assert max(len(p.encode()) for p in got) <= MAX_PATH
    assert got == want and skipped == want_skipped == 1


# a guest that answers reads as slowly as it may: a byte every 45 s (within the host's 60 s timeout of a call), for
# as long as the download lasts; each download's first read says so on the console (the host reads it without the
# agent: QEMU serves one agent connection at a time, and the daemon holds it)
STALL_READS = '''
import os, sys, threading
_f = sys._getframe()
while "OPS" not in _f.f_globals:
    _f = _f.f_back
OPS = _f.f_globals["OPS"]
_go = threading.Event()
def _stalled_read(a):
    if a.get("offset") == 0:
        fd = os.open("/dev/console", os.O_WRONLY | os.O_NOCTTY)
        os.write(fd, b"\\nforkd-stalled-read\\n")
        os.close(fd)
    if _go.wait(45):
        return {"data": "", "eof": True}
    return {"data": "eA==", "eof": False}
OPS["fs_read"] = _stalled_read
print("stalling")
'''


def wait_for(what: str, cond, state, timeout: float = 120.0) -> None:
    """Poll `cond` until it holds; fail after `timeout` seconds (a guard, not a measure), saying `state()`."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"gave up waiting for {what}: {state()}"
        time.sleep(0.2)


def test_a_stalled_guest_holds_its_own_slots_only(rt, fork, tmp_path, monkeypatch):
    """Many downloads from two children whose agents answer reads as slowly as they may: each child holds at most
    its slots, the client at most its own; the rest are refused at once (429, Retry-After, naming the child or the
    client); the routes that touch no guest, and another client's calls into a child that answers, still answer."""
    per_child, per_client, n = 4, 6, 48  # n: more than the server's default thread pool (40) holds
    monkeypatch.setenv("FORKD_GUEST_IO_PER_CHILD", str(per_child))
    monkeypatch.setenv("FORKD_GUEST_IO_PER_CLIENT", str(per_client))
    *slow, calm = fork(3)
    for c in slow:
        assert rt.exec_code(c.id, STALL_READS)["stdout"] == "stalling\n"
    d = start_api_daemon(rt.layout.home, tmp_path)
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def download(i: int) -> None:
        try:
            with d.tcp() as c:
                r = c.get(f"/v1/sandboxes/{slow[i % 2].id}/files/content", params={"path": "/root/anything"},
                          timeout=600)
        except httpx.HTTPError:
            return  # the daemon stopped under a download it let through
        with lock:
            answers.append(r)

    def arrived() -> int | None:
        """Reads the guests received (their console says), None when the daemon has no thread left to tell."""
        total = 0
        with d.unix() as u:
            for c in slow:
                try:
                    r = u.get(f"/v1/sandboxes/{c.id}/logs", timeout=20)
                except httpx.TimeoutException:
                    return None
                total += base64.b64decode(r.json()["data"]).count(b"forkd-stalled-read")
        return total

    def refused() -> list[httpx.Response]:
        with lock:
            return [r for r in answers if r.status_code == 429]

    def state() -> str:
        with lock:
            codes = [r.status_code for r in answers]
        return f"{len(codes)} answered ({sorted(set(codes))}), {arrived()} held in the guests"

    threads = [threading.Thread(target=download, args=(i,), daemon=True) for i in range(n)]
    try:
        for t in threads:
            t.start()
        # every download answered or held in a guest, or the daemon's threads are all taken (without limits)
        wait_for("the downloads to be answered or held",
                 lambda: (k := arrived()) is None or len(answers) + k >= DEFAULT_POOL, state)
        with d.tcp() as c:
            try:
                r = c.get("/v1/snapshots", timeout=30)  # a route that touches no guest still answers
            except httpx.TimeoutException:
                pytest.fail("GET /v1/snapshots got no answer while stalled guests held the daemon's threads")
            assert r.status_code == 200
        wait_for(f"{per_client} reads held in the guests and {n - per_client} refused",
                 lambda: len(refused()) == n - per_client and arrived() == per_client, state)
        assert all(r.headers.get("Retry-After") for r in refused())
        details = [r.json()["detail"] for r in refused()]
        assert any("client tcp:127.0.0.1" in m for m in details)  # the client's own limit, named
        assert all(any(c.id in m for c in slow) for m in details)  # each names the child it was for
        with d.tcp() as c:
            r = c.get(f"/v1/sandboxes/{calm.id}/files/stat", params={"path": "/root"}, timeout=60)
            assert r.status_code == 429 and "client tcp:127.0.0.1" in r.json()["detail"], r.text  # at its limit
        with d.unix() as u:  # another client's call into a child that answers goes through
            r = u.get(f"/v1/sandboxes/{calm.id}/files/stat", params={"path": "/root"}, timeout=60)
            assert r.status_code == 200 and r.json()["type"] == "dir", r.text
        assert arrived() == per_client and len(refused()) == n - per_client
    finally:
        stop_api_daemon(d)  # ends the held downloads (and the daemon's hold on the children's agents)
        for t in threads:
            t.join(60)
