"""A `forkd pack` (or `forkd push` to a file:// hub) killed with -9 while it writes leaves nothing at its output
path, and its half-written temporary beside that path, outside the home, is found through its note in the home's
tmp/ (forkd.base.outside): `forkd gc` removes it, and so does the next pack. Real CLI processes on the fake VMM
driver (no VM): each is paused by a wrapper as it starts to read a member into the archive (after the temporary is
open and the manifest written), reports it on a pipe, and is killed there; a test never guesses with a sleep. An
`forkd unpack` killed the same way, once it has extracted its members, leaves only its owned work directory under
the home's tmp/, which gc takes, and no snapshot."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from forkd.base.outside import NOTE_PREFIX, noted_temporary, sweep_outside
from forkd.base.owners import owned_under, owner_of
from forkd.base.paths import Layout
from forkd.core.pack import pack, read_manifest
from forkd.core.runtime import Runtime
from tests.conftest import BASE_TAG
from tests.fake_vmm import fake_base, fake_home, fake_rt  # noqa: F401 - fixtures

# The CLI, paused for good as the archive's second member is read into it; "paused" on the fd of argv[1] then.
PAUSED_CLI = """
import os, sys, threading
import forkd.core.pack.write as w
fd, seen = int(sys.argv[1]), []
class Paused(w.HashingReader):
    def read(self, *a):
        seen.append(1)
        if len(seen) > 1:
            os.write(fd, b"paused\\n")
            threading.Event().wait()
        return super().read(*a)
w.HashingReader = Paused
from forkd.cli import main
sys.argv = ["forkd", *sys.argv[2:]]
main()
"""


# The CLI, paused for good once an unpack has extracted every member into its work directory, before it checks
# and installs them.
PAUSED_UNPACK = """
import os, sys, threading
import forkd.core.pack.read as r
fd = int(sys.argv[1])
def paused(*a):
    os.write(fd, b"paused\\n")
    threading.Event().wait()
r.check_staged = paused
from forkd.cli import main
sys.argv = ["forkd", *sys.argv[2:]]
main()
"""


def _env(home: Path | None = None) -> dict[str, str]:
    return dict(os.environ, FORKD_NO_DAEMON="1", **({"FORKD_HOME": str(home)} if home else {}))


def cli(*args: str, home: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forkd.cli.main", *args], env=_env(home), capture_output=True,
                          text=True, timeout=300)


def killed_mid_write(*args: str, code: str = PAUSED_CLI, home: Path | None = None) -> int:
    """Run the CLI with `args`, wait until it is writing (`code` pauses it there), kill it with -9; its pid."""
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", code, str(w), *args], env=_env(home), pass_fds=(w,),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], 300)
        said = os.read(r, 64) if ready else b""
        assert said == b"paused\n", f"the CLI never got to writing: {proc.poll()} {said!r}"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        os.close(r)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    return proc.pid


def left_by(pid: int, *dirs: Path) -> list[Path]:
    return sorted(p for d in dirs for p, o in owned_under(d, 1) if o.pid == pid)


def test_a_pack_killed_while_writing_leaves_nothing_once_gc_ran(fake_base, fake_home, tmp_path):  # noqa: F811
    out = tmp_path / "out" / "p.tar.zst"
    out.parent.mkdir()
    pid = killed_mid_write("pack", "--tag", BASE_TAG, "--output-file", str(out))
    tmp = Layout(fake_home).tmp
    beside, notes = left_by(pid, out.parent), left_by(pid, tmp)
    assert not out.exists(), "a killed pack left a file at its output path"
    assert len(beside) == 1 and beside[0].name.startswith(".p.tar.zst.tmp-"), beside  # the crash state, for real
    assert [n.name.split("-")[0] for n in notes] == [NOTE_PREFIX]
    res = cli("gc", "-o", "json")
    assert res.returncode == 0, res.stderr
    assert {str(beside[0]), str(notes[0])} <= set(json.loads(res.stdout)["temporaries"])
    assert not list(out.parent.iterdir()) and not left_by(pid, tmp)
    res = cli("pack", "--tag", BASE_TAG, "--output-file", str(out))
    assert res.returncode == 0, res.stderr
    assert read_manifest(out)["head"] == BASE_TAG and list(out.parent.iterdir()) == [out]


def test_the_next_pack_removes_a_killed_packs_temporary(fake_base, fake_home, tmp_path):  # noqa: F811
    out = tmp_path / "p.tar.zst"
    pid = killed_mid_write("pack", "--tag", BASE_TAG, "--output-file", str(out))
    assert left_by(pid, tmp_path) and not out.exists()
    res = cli("pack", "--tag", BASE_TAG, "--output-file", str(tmp_path / "q.tar.zst"))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.tar.zst"]
    assert not left_by(pid, Layout(fake_home).tmp)


def test_a_push_killed_while_writing_leaves_the_hub_clean_once_gc_ran(fake_base, fake_home, tmp_path):  # noqa: F811
    hub = tmp_path / "hub"
    pid = killed_mid_write("push", "acme/crash@1.0", "--tag", BASE_TAG, "--hub", f"file://{hub}")
    where = hub / "acme" / "crash"
    assert left_by(pid, where), "the push was not killed while writing beside its destination"
    assert not (where / "1.0.tar.zst").exists() and not (hub / "registry.json").exists()
    res = cli("gc", "-o", "json")
    assert res.returncode == 0, res.stderr
    assert not list(where.iterdir())


def test_an_unpack_killed_mid_way_installs_nothing_and_gc_takes_its_work(fake_rt, fake_base, tmp_path):  # noqa: F811
    """Unpack works under the home's tmp/ only (an owned work directory): no note is needed for gc to find it."""
    packed, other = tmp_path / "base.tar.zst", tmp_path / "other-home"
    pack(fake_rt, BASE_TAG, packed)
    pid = killed_mid_write("unpack", str(packed), code=PAUSED_UNPACK, home=other)
    [work] = left_by(pid, Layout(other).tmp)
    assert work.name.startswith("unpack-") and any(work.rglob("*"))  # the members it had extracted
    assert not [s for s in Runtime(Layout(other)).store.list() if s.tag == BASE_TAG]
    res = cli("gc", "-o", "json", home=other)
    assert res.returncode == 0, res.stderr
    assert str(work) in json.loads(res.stdout)["temporaries"] and not work.exists()
    res = cli("unpack", str(packed), home=other)
    assert res.returncode == 0, res.stderr
    try:
        assert Runtime(Layout(other)).store.get(BASE_TAG).status == "ready"
        assert not owned_under(Layout(other).tmp)
    finally:
        if Layout(other).shm_dir is not None:  # its tmpfs directory, if the unpack made one
            shutil.rmtree(Layout(other).shm_dir, ignore_errors=True)


def _dead_note(tmp_dir: Path, dest: Path) -> tuple[Path, Path]:
    """A note and its temporary made by a process now dead (made through noted_temporary, then killed)."""
    code = ("import sys, threading; from pathlib import Path; from forkd.base.outside import noted_temporary\n"
            "with noted_temporary(Path(sys.argv[1]), Path(sys.argv[2])) as t:\n"
            "    t.write_bytes(b'half'); print(t, flush=True); threading.Event().wait()\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(dest), str(tmp_dir)], stdout=subprocess.PIPE, text=True)
    tmp = Path(proc.stdout.readline().strip())
    proc.kill()
    proc.wait()
    proc.stdout.close()
    notes = [p for p, o in owned_under(tmp_dir, 1) if o.pid == proc.pid]
    assert tmp.is_file() and len(notes) == 1
    return notes[0], tmp


@pytest.mark.parametrize("case", ["link", "other-owner", "not-json", "relative"])
def test_a_note_removes_only_its_own_makers_regular_file(tmp_path, case):
    """A note is believed no further than it can be checked: a link in the temporary's place, a name made by
    another maker, a note that is not JSON or names a relative path: the note goes, nothing else is touched."""
    home_tmp, out = tmp_path / "tmp", tmp_path / "out"
    home_tmp.mkdir(mode=0o700)
    out.mkdir()
    note, tmp = _dead_note(home_tmp, out / "p.tar.zst")
    victim = tmp_path / "victim"
    victim.write_text("keep")
    if case == "link":
        tmp.unlink()
        tmp.symlink_to(victim)
    elif case == "other-owner":
        with noted_temporary(out / "x", home_tmp) as mine:  # a live maker's name: not the note's maker
            mine.write_text("keep")
            note.write_text(json.dumps({"path": str(mine)}))
            assert sweep_outside(home_tmp) == [note] and mine.exists()
        return
    elif case == "not-json":
        note.write_text("{")
    else:
        note.write_text(json.dumps({"path": tmp.name}))
    assert sweep_outside(home_tmp) == [note]
    assert victim.read_text() == "keep" and (tmp.is_symlink() or tmp.exists())


def test_a_live_makers_note_and_temporary_are_left_alone(tmp_path):
    home_tmp = tmp_path / "tmp"
    home_tmp.mkdir(mode=0o700)
    with noted_temporary(tmp_path / "p.tar.zst", home_tmp) as t:
        t.write_bytes(b"in progress")
        assert sweep_outside(home_tmp) == [] and t.exists()
        assert owner_of(t.name).pid == os.getpid()
    assert not t.exists() and not list(home_tmp.iterdir())
