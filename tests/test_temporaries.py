"""Owned temporaries (issue 15, item 5): every temporary names its maker (pid + start time), so start-up recovery
and `forkd gc` remove exactly the dead makers' ones. Real processes: a `forkd pull` CLI stalled mid-download by a
local hub, processes killed with -9 in the middle of the store's own atomic write of a flat image on tmpfs, a real
daemon started over them (no VMs), and a layer build killed with -9 while its VM runs (real VM)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from forkd.base.owners import Owner, dead_under, is_dead_temporary, owned_name, owned_under, owner_alive, owner_of
from forkd.base.paths import Layout
from forkd.base.procs import start_time
from tests.conftest import BASE_TAG, qemu_pids
from tests.test_api import start_api_daemon, stop_api_daemon

PACK = "acme/slow/1.0.tar.zst"
SIZE = 1 << 20

# A process making temporaries through forkd's own code, then waiting: an unpack-style work directory in tmp/, and
# a flat image half written by the store's atomic publish into the home's flat cache (on tmpfs).
MAKER = """
import os, sys, time
from pathlib import Path
from forkd.base.atomic import publish
from forkd.base.owners import owned_name
from forkd.base.paths import Layout
from forkd.base.private import make_private_dir
lay = Layout(Path(sys.argv[1])).ensure()
work = make_private_dir(lay.tmp / owned_name("unpack"))
(work / "member").write_bytes(b"x" * 4096)
with publish(lay.make_flat_cache() / (sys.argv[2] * 64 + ".mem"), mode=0o400) as fd:
    os.write(fd, b"\\1" * 65536)
    print("ready", flush=True)
    time.sleep(600)
"""


class _SlowHub(BaseHTTPRequestHandler):
    """A hub whose one pack never finishes downloading: a byte every 2 s (under the client's 30 s timeout)."""

    stop = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/registry.json":
            body = json.dumps({"packs": {"acme/slow": {"latest": "1.0", "versions": {
                "1.0": {"file": PACK, "sha256": "0" * 64, "size": SIZE}}}}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(SIZE))
        self.end_headers()
        while not self.stop.wait(2.0):
            try:
                self.wfile.write(b"\0")
                self.wfile.flush()
            except OSError:
                return

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def slow_hub():
    _SlowHub.stop.clear()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _SlowHub)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/"
    _SlowHub.stop.set()
    srv.shutdown()


@pytest.fixture
def fresh_home(tmp_path):
    home = tmp_path / "h"
    lay = Layout(home).ensure()
    yield home
    if lay.shm_dir is not None:
        shutil.rmtree(lay.shm_dir, ignore_errors=True)  # this home's tmpfs directory (flat cache)


def wait_for(cond, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (got := cond()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return got


def pulls(home: Path, pid: int) -> list[Path]:
    return [p for p in (home / "tmp").glob("pull-*.tar.zst") if (o := owner_of(p.name)) and o.pid == pid]


def start_pull(home: Path, hub: str) -> subprocess.Popen:
    env = dict(os.environ, FORKD_HOME=str(home), FORKD_HUB=hub, FORKD_NO_DAEMON="1")
    proc = subprocess.Popen([sys.executable, "-m", "forkd.cli.main", "pull", "acme/slow"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: pulls(home, proc.pid), "the pull's download file")
    return proc


def start_maker(home: Path, letter: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", MAKER, str(home), letter], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def made_by(home: Path, pid: int) -> list[Path]:
    lay = Layout(home)
    roots = [home] + ([lay.shm_dir] if lay.shm_dir else [])
    return sorted(p for r in roots for p, o in owned_under(r) if o.pid == pid)


def kill9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_owned_names_round_trip_and_pid_reuse():
    name = owned_name("unpack")
    me = owner_of(name)
    assert me == Owner(os.getpid(), start_time(os.getpid())) and owner_alive(name) is True
    assert owner_of(owned_name("forkd-p", ".mem")).pid == os.getpid()
    assert owner_of(owned_name(".manifest.json.tmp")) == me
    # the same pid with another start time: a reused pid, not the maker
    reused = name.replace(f"@{name.split('@')[1].split('-')[0]}-", f"@{'z' * 9}-")
    assert owner_of(reused).pid == os.getpid() and is_dead_temporary(reused)
    for foreign in ("unpack-123-abcdef", "snap-1_a-beef.json", "memory.bin", "c0123456789"):
        assert owner_of(foreign) is None and owner_alive(foreign) is None and not is_dead_temporary(foreign)


def test_gc_removes_exactly_the_dead_makers_temporaries(fresh_home, slow_hub):
    live_pull, dead_pull = start_pull(fresh_home, slow_hub), start_pull(fresh_home, slow_hub)
    live_maker, dead_maker = start_maker(fresh_home, "a"), start_maker(fresh_home, "b")
    try:
        dead = sorted(made_by(fresh_home, dead_pull.pid) + made_by(fresh_home, dead_maker.pid))
        live = made_by(fresh_home, live_pull.pid) + made_by(fresh_home, live_maker.pid)
        assert len(dead) == 3 and len(live) == 3  # each: a download (pull), an unpack dir and a flat image
        assert {p.parent for p in dead if p.name.startswith(".")} == {Layout(fresh_home).flat_cache}
        kill9(dead_pull)
        kill9(dead_maker)
        assert sorted(dead_under(fresh_home) + dead_under(Layout(fresh_home).shm_dir)) == dead
        env = dict(os.environ, FORKD_HOME=str(fresh_home), FORKD_NO_DAEMON="1")
        res = subprocess.run([sys.executable, "-m", "forkd.cli.main", "gc", "-o", "json"], env=env,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert sorted(json.loads(res.stdout)["temporaries"]) == [str(p) for p in dead]
        assert not any(p.exists() for p in dead) and all(p.exists() for p in live)
        assert live_pull.poll() is None and live_maker.poll() is None
    finally:
        for p in (live_pull, dead_pull, live_maker, dead_maker):
            kill9(p)


def test_daemon_start_up_keeps_a_live_cli_pull_and_removes_dead_ones(fresh_home, slow_hub, tmp_path):
    live_pull, dead_pull = start_pull(fresh_home, slow_hub), start_pull(fresh_home, slow_hub)
    dead_maker = start_maker(fresh_home, "c")
    live = made_by(fresh_home, live_pull.pid)
    dead = made_by(fresh_home, dead_pull.pid) + made_by(fresh_home, dead_maker.pid)
    kill9(dead_pull)
    kill9(dead_maker)
    d = start_api_daemon(fresh_home, tmp_path)
    try:
        assert all(p.exists() for p in live), "start-up recovery removed a live CLI's download"
        assert live_pull.poll() is None
        assert not [p for p in dead if p.exists()], "start-up recovery left a dead maker's temporaries"
        assert not dead_under(fresh_home) and not dead_under(Layout(fresh_home).shm_dir)
    finally:
        stop_api_daemon(d)
        kill9(live_pull)


LAYER_BUILD = """
import sys
from forkd.core.requests import LayerBuild
from forkd.core.runtime import Runtime
Runtime().snapshot_diff(LayerBuild.of(tag=sys.argv[1], parent_tag=sys.argv[2], run=("sleep 900",)))
"""


@pytest.mark.vm
def test_a_layer_build_killed_mid_way_leaves_only_dead_temporaries_and_gc_takes_them(rt, home, base):
    """The real build path: a layer build (scratch guest RAM on tmpfs, a work directory holding the VMM's sockets)
    killed with -9 while its guest runs a step; gc removes its temporaries, nothing owned by a dead maker is left."""
    before = set(qemu_pids(home))
    proc = subprocess.Popen([sys.executable, "-c", LAYER_BUILD, "tmpkill", BASE_TAG], env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def started() -> bool:  # the VMM restored and its agent answered: the build is in its steps
            made = made_by(home, proc.pid)
            return any(p.name.startswith("l-") and (p / "agent.sock").exists() for p in made) and \
                len(made) >= 2 and set(qemu_pids(home)) - before
        wait_for(started, "the layer build's VMM", timeout=300)
        time.sleep(1.0)
        made = made_by(home, proc.pid)
        assert any(p.name.startswith("forkd-layer-tmpkill-") and p.suffix == ".mem" for p in made), made
    finally:
        kill9(proc)
    for pid in set(qemu_pids(home)) - before:  # the build's VMM, orphaned by the kill (no record names it)
        os.kill(pid, signal.SIGKILL)
    assert set(dead_under(home) + dead_under(rt.layout.shm_dir)) == set(made)
    res = subprocess.run([sys.executable, "-m", "forkd.cli.main", "gc", "-o", "json"], capture_output=True,
                         text=True, env=dict(os.environ, FORKD_NO_DAEMON="1"), timeout=120)
    assert res.returncode == 0, res.stderr
    assert set(json.loads(res.stdout)["temporaries"]) == {str(p) for p in made}
    assert not dead_under(home) and not dead_under(rt.layout.shm_dir)
    assert rt.store.recover() == ["tmpkill"]  # the snapshot it was writing: failed, not left `writing`
    rt.store.remove("tmpkill")
