"""Fixtures and helpers for the BRANCH tests (test_branch.py, test_branch_diff.py): a runtime whose home is on
tmpfs, children forked in it, marks written into a child and read back."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from forkd.base.paths import Layout
from forkd.core.branch import wait_background
from forkd.core.requests import ParentBuild, Spawn
from forkd.core.runtime import Runtime
from tests.seed import seed_home

SBASE = "sbase"
WRITER = ("import threading, time\n"
          "WRITES = [0]\n"
          "def _writer():\n"
          "    buf = bytearray(16 << 20)\n"
          "    i = 0\n"
          "    while True:\n"
          "        buf[(i * 4096) % len(buf)] = i & 255\n"
          "        i += 1\n"
          "        WRITES[0] = i\n"
          "        if i % 512 == 0:\n"
          "            time.sleep(0.001)\n"
          "threading.Thread(target=_writer, daemon=True).start()\n")


@contextmanager
def tmpfs_runtime(rt: Runtime, prefix: str, parent: ParentBuild) -> Iterator[Runtime]:
    """A runtime whose home is on tmpfs (/dev/shm), sharing `rt`'s image and accelerator decision, with `parent`
    built. Afterwards its children, home and flat images are gone; QEMU processes it left behind fail the test."""
    from tests.conftest import qemu_pids  # conftest imports this module's fixtures

    image, _ = rt.build_image()  # what the copy below takes: the session's image and accelerator decision
    rt.accelerator(image)
    home = Path(tempfile.mkdtemp(prefix=prefix, dir="/dev/shm"))
    layout = Layout(home)
    assert seed_home(layout, rt.layout), f"the session's image was not copied into {home}"
    r = Runtime(layout)
    r.create_snapshot(parent)
    yield r
    wait_background(r, 60)
    r.kill(all_=True)
    leaked = qemu_pids(home)
    for pid in leaked:
        os.kill(pid, 9)
    shutil.rmtree(layout.flat_cache.parent, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)
    assert not leaked, f"QEMU processes leaked: {leaked}"


def tracked_forks(runtime: Runtime, default_tag: str) -> Iterator:
    """A fixture body: yields fork(n=1, tag=default_tag, **Spawn fields) and kills what it forked afterwards."""
    made: list[str] = []

    def _fork(n=1, tag=default_tag, **kw):
        recs = runtime.fork(Spawn.of(tag=tag, n=n, **kw))
        made.extend(r.id for r in recs)
        return recs

    yield _fork
    ids = [i for i in made if (runtime.layout.children / i).exists()]
    if ids:
        runtime.kill(ids)


@pytest.fixture(scope="module")
def srt(rt):
    """A runtime whose store is on tmpfs (/dev/shm), sharing the session's image and accelerator decision."""
    with tmpfs_runtime(rt, "fkbr", ParentBuild.of(tag=SBASE, memory_mib=512, warm_imports=("decimal",),
                                                   warm_exec=("MARK = 'warm'",))) as r:
        yield r


@pytest.fixture
def sfork(srt):
    yield from tracked_forks(srt, SBASE)


def _mark(rt: Runtime, cid: str, value: str) -> None:
    assert rt.exec(cid, ["sh", "-c", f"echo {value} > /root/mark.txt"])["exit_code"] == 0
    assert rt.exec_code(cid, f"MARK = {value!r}")["error"] is None


def _seen(rt: Runtime, cid: str) -> tuple[str, str]:
    f = rt.exec(cid, ["cat", "/root/mark.txt"])["stdout"].strip()
    g = rt.eval(cid, "MARK")["value"]
    return f, g
