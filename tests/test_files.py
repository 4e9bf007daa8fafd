"""Files in a sandbox on the fake VMM driver (tests/fake_vmm.py, which runs the real guest agent): the agent's fs_*
ops through the host's checks (forkd.vmm.agent_files), the streamed API routes, the SDK's `sb.files`, `forkd cp` both
ways and watches. A guest writing hostile bytes and the caps inside a VM: tests/security/test_files_guest.py."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from forkd.base.errors import Conflict, InvalidInput, NotFound
from forkd.client.copy import copy, parse_location
from forkd.client.files import LocalFiles
from forkd.client.local import LocalBackend
from forkd.reconciler.control import Control
from forkd.sdk import Sandbox
from tests.conftest import BASE_TAG
from tests.fake_vmm import on_fake_base, on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver
from tests.test_api import start_api_daemon, stop_api_daemon

MIB = 1 << 20


@pytest.fixture(scope="module")
def daemon(home, base, tmp_path_factory):
    d = start_api_daemon(home, tmp_path_factory.mktemp("files"))
    yield d
    stop_api_daemon(d)


def pattern(n: int, seed: int = 1) -> bytes:
    """n bytes that differ at every offset (a misplaced chunk shows)."""
    block = hashlib.sha256(str(seed).encode()).digest() * 2048  # 64 KiB
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.sha256(block[:32] + i.to_bytes(8, "big")).digest() + block[32:4096]
        i += 1
    return bytes(out[:n])


def test_metadata_ops_and_errors(rt, fork):
    [c] = fork(1)
    f = LocalFiles(rt, c.id)
    assert f.mkdir("/root/t/a/b") is True and f.mkdir("/root/t/a/b") is False
    assert f.write("/root/t/a/b/one.txt", b"one") == 3
    assert f.write("/root/t/two.bin", iter([b"x" * 5, b"", b"y" * 7]), mode=0o600) == 12
    st = f.stat("/root/t/two.bin")
    assert (st.type, st.size, st.mode, st.name) == ("file", 12, 0o600, "two.bin")
    assert [(e.name, e.type) for e in f.list("/root/t")] == [("a", "dir"), ("two.bin", "file")]
    deep = [e.path for e in f.list("/root/t", depth=3)]
    assert deep == ["/root/t/a", "/root/t/a/b", "/root/t/a/b/one.txt", "/root/t/two.bin"]  # depth first
    assert f.exists("/root/t/two.bin") and not f.exists("/root/t/nope") and not f.exists("/root/t/two.bin/x")
    f.rename("/root/t/two.bin", "/root/t/a/three.bin")
    f.chmod("/root/t/a/three.bin", 0o640)
    assert f.stat("/root/t/a/three.bin").mode == 0o640
    assert b"".join(f.read("/root/t/a/three.bin")) == b"x" * 5 + b"y" * 7
    with pytest.raises(NotFound):
        f.stat("/root/t/two.bin")
    with pytest.raises(NotFound):
        list(f.read("/root/nope"))
    with pytest.raises(Conflict):
        f.remove("/root/t")  # not empty
    f.remove("/root/t", recursive=True)
    assert not f.exists("/root/t")
    with pytest.raises(InvalidInput):
        f.remove("/")
    assert f.write("/root/empty", b"") == 0 and f.stat("/root/empty").size == 0
    names = [e.name for e in f.list("/root")]
    assert not [n for n in names if ".forkd-" in n], names  # no upload temporaries left behind


def test_many_entries_are_paged(rt, fork):
    [c] = fork(1)
    rt.exec(c.id, ["sh", "-c", "mkdir /root/many && cd /root/many && for i in $(seq 1 700); do : > f$i; done"])
    names = [e.name for e in LocalFiles(rt, c.id).list("/root/many")]
    assert len(names) == 700 and names == sorted(names)


def test_streamed_upload_and_download_past_16_mib_through_the_api(daemon, rt):
    """40 MiB each way: over the old 16 MiB cap of read_file, in many chunks, never buffered whole."""
    data = pattern(40 * MIB + 12345)
    with daemon.tcp() as h:
        [sb] = h.post("/v1/sandboxes", json={"snapshot_tag": BASE_TAG}).json()
        try:
            base = f"/v1/sandboxes/{sb['id']}/files"
            chunks = (data[i:i + 3 * MIB] for i in range(0, len(data), 3 * MIB))
            r = h.put(f"{base}/content", params={"path": "/root/big.bin"}, content=chunks,
                      headers={"Content-Type": "application/octet-stream"})
            assert r.status_code == 200, r.text
            assert r.json() == {"path": "/root/big.bin", "bytes": len(data)}
            got = hashlib.sha256()
            n = 0
            with h.stream("GET", f"{base}/content", params={"path": "/root/big.bin"}) as resp:
                assert resp.status_code == 200 and resp.headers.get("transfer-encoding") == "chunked"
                for chunk in resp.iter_bytes():
                    got.update(chunk)
                    n += len(chunk)
            assert n == len(data) and got.hexdigest() == hashlib.sha256(data).hexdigest()
            r = h.get(f"{base}/content", params={"path": "/root/missing"})
            assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
            r = h.post(f"{base}/mkdir", json={"path": "/root/d", "bogus": 1})
            assert r.status_code == 422 and "bogus" in r.text
        finally:
            h.delete(f"/v1/sandboxes/{sb['id']}")


def test_sdk_files_e2b_style(daemon):
    with Sandbox.create(template=BASE_TAG, url=daemon.url, token=daemon.token) as sb:
        info = sb.files.write("/root/e2b/a.txt", "hello")
        assert (info.type, info.size, info.path) == ("file", 5, "/root/e2b/a.txt")
        assert sb.files.read("/root/e2b/a.txt") == "hello"
        assert sb.files.write("/root/e2b/b.bin", io.BytesIO(b"\x00\xff" * 1000)).size == 2000
        assert b"".join(sb.files.read("/root/e2b/b.bin", format="stream")) == b"\x00\xff" * 1000
        assert [e.name for e in sb.files.list("/root/e2b")] == ["a.txt", "b.bin"]
        assert sb.files.make_dir("/root/e2b/sub") and not sb.files.make_dir("/root/e2b/sub")
        assert sb.files.rename("/root/e2b/a.txt", "/root/e2b/sub/a.txt").path == "/root/e2b/sub/a.txt"
        assert sb.files.exists("/root/e2b/sub/a.txt") and not sb.files.exists("/root/e2b/a.txt")
        assert sb.files.get_info("/root/e2b/sub").type == "dir"
        sb.files.remove("/root/e2b")
        assert not sb.files.exists("/root/e2b")


def test_watch_dir_streams_events(daemon):
    with Sandbox.create(template=BASE_TAG, url=daemon.url, token=daemon.token) as sb:
        sb.files.make_dir("/root/w")
        seen = []
        h = sb.files.watch_dir("/root/w", on_event=seen.append)
        assert h.kind in ("inotify", "poll")
        sb.files.write("/root/w/new.txt", "x")
        sb.commands.run("echo more >> /root/w/new.txt && rm /root/w/new.txt")
        deadline = time.monotonic() + 60
        events = []
        while time.monotonic() < deadline and not any(e.type == "remove" for e in events):
            events += h.get_new_events()
            time.sleep(0.2)
        h.stop()
        kinds = {(e.type, e.name) for e in events}
        assert ("remove", "new.txt") in kinds, events
        assert {"create"} & {t for t, n in kinds if n.startswith(".new.txt.forkd-") or n == "new.txt"}, events
        assert seen[:len(events)] == events  # on_event got the same ones


def test_watch_ndjson_route(daemon):
    with daemon.tcp() as h:
        [sb] = h.post("/v1/sandboxes", json={"snapshot_tag": BASE_TAG}).json()
        try:
            base = f"/v1/sandboxes/{sb['id']}/files"
            assert h.get(f"{base}/watch", params={"path": "/root/nope", "timeout": 5}).status_code == 404
            lines = []
            with h.stream("GET", f"{base}/watch", params={"path": "/root", "timeout": 20}) as resp:
                assert resp.headers["content-type"].startswith("application/x-ndjson")
                for line in resp.iter_lines():
                    lines.append(json.loads(line))
                    if lines[-1]["type"] == "started":
                        h.post(f"{base}/mkdir", json={"path": "/root/made-while-watched"})
                    if lines[-1].get("name") == "made-while-watched":
                        break
            assert lines[0]["type"] == "started" and lines[-1] == {"type": "create", "name": "made-while-watched"}
        finally:
            h.delete(f"/v1/sandboxes/{sb['id']}")


def _tree(root: Path) -> dict[str, object]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = ("link", os.readlink(p)) if p.is_symlink() else ("dir",) if p.is_dir() else \
            ("file", p.read_bytes(), p.stat().st_mode & 0o777)
    return out


def _cli(daemon, *args, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forkd.cli.main", *args], capture_output=True, input=input,
                          env=daemon.env(), timeout=600)


def test_cp_both_ways_files_dirs_and_tar_streams(daemon, tmp_path):
    src = tmp_path / "proj"
    (src / "sub" / "deep").mkdir(parents=True)
    (src / "a.txt").write_text("alpha")
    (src / "sub" / "b.bin").write_bytes(pattern(3 * MIB + 7))
    (src / "sub" / "deep" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(src / "sub" / "deep" / "run.sh", 0o755)
    os.symlink("../a.txt", src / "sub" / "link")
    with Sandbox.create(template=BASE_TAG, url=daemon.url, token=daemon.token) as sb:
        r = _cli(daemon, "cp", str(src), f"{sb.id}:/root/copied", "-o", "json")  # a new name in the guest
        assert r.returncode == 0, r.stderr
        assert sb.files.read("/root/copied/a.txt") == "alpha"
        assert sb.files.get_info("/root/copied/sub/link").target == "../a.txt"
        r = _cli(daemon, "cp", str(src / "a.txt"), f"{sb.id}:/root/copied/sub")  # a file into a dir
        assert r.returncode == 0 and sb.files.read("/root/copied/sub/a.txt") == "alpha", r.stderr
        out = tmp_path / "back"
        r = _cli(daemon, "cp", f"{sb.id}:/root/copied", str(out))  # out does not exist: it is the new name
        assert r.returncode == 0, r.stderr
        expect = _tree(src)
        expect["sub/a.txt"] = ("file", b"alpha", 0o644 & (src / "a.txt").stat().st_mode)
        assert _tree(out) == expect
        (tmp_path / "into").mkdir()
        assert _cli(daemon, "cp", f"{sb.id}:/root/copied/a.txt", str(tmp_path / "into")).returncode == 0
        assert (tmp_path / "into" / "a.txt").read_text() == "alpha"
        r = _cli(daemon, "cp", f"{sb.id}:/root/copied/sub", "-")  # tar on stdout
        with tarfile.open(fileobj=io.BytesIO(r.stdout)) as t:
            assert "sub/deep/run.sh" in t.getnames()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            ti = tarfile.TarInfo("from-stdin.txt")
            ti.size = 5
            t.addfile(ti, io.BytesIO(b"stdin"))
        r = _cli(daemon, "cp", "-", f"{sb.id}:/root/in", input=buf.getvalue())
        assert r.returncode == 0 and sb.files.read("/root/in/from-stdin.txt") == "stdin", r.stderr
        r = _cli(daemon, "cp", f"{sb.id}:/root/nope", str(tmp_path / "x"))
        assert r.returncode == 3, r.stderr


def test_cp_in_process(rt, fork, tmp_path):
    """The same copy without a daemon (LocalBackend), and the location syntax."""
    [c] = fork(1)
    assert parse_location(f"{c.id}:/etc") == (c.id, "/etc") and parse_location("./a:b") == (None, "./a:b")
    assert parse_location("-") == (None, "-") and parse_location("/tmp/x") == (None, "/tmp/x")
    be = LocalBackend(Control(rt))
    (tmp_path / "f.txt").write_text("local")
    copy(be, str(tmp_path / "f.txt"), f"{c.id}:/root/f.txt")
    res = copy(be, f"{c.id}:/root/f.txt", str(tmp_path / "g.txt"))
    assert (tmp_path / "g.txt").read_text() == "local" and res["files"] == 1
    with pytest.raises(InvalidInput):
        copy(be, str(tmp_path), str(tmp_path / "y"))  # no sandbox side


def test_files_routes_in_openapi(daemon):
    with daemon.tcp() as h:
        spec = h.get("/openapi.json").json()
    paths = spec["paths"]
    for p in ("content", "list", "stat", "exists", "rename", "mkdir", "chmod", "archive", "watch"):
        assert f"/v1/sandboxes/{{id}}/files/{p}" in paths, p
    assert "application/x-ndjson" in paths["/v1/sandboxes/{id}/files/watch"]["get"]["responses"]["200"]["content"]
    assert "application/octet-stream" in paths["/v1/sandboxes/{id}/files/content"]["put"]["requestBody"]["content"]


def test_raw_uploads_refuse_cors_simple_types(daemon):
    """The streamed uploads take octet-stream (or untyped) bodies only: a web page's text/plain never reaches them."""
    with daemon.tcp() as h:
        for prefix, sub in itertools.product(("sandboxes", "children"), ("content", "archive")):
            url = f"/v1/{prefix}/cnope/files/{sub}"
            for ctype, code in (("text/plain", 415), ("application/x-www-form-urlencoded", 415),
                                ("application/octet-stream", 404), (None, 404)):
                headers = {"Content-Type": ctype} if ctype else {}
                assert h.put(url, params={"path": "/x"}, content=b"x", headers=headers).status_code == code, ctype
        r = h.post("/v1/sandboxes/cnope/files/mkdir", content=b'{"path": "/x"}', headers={"Content-Type": "text/plain"})
        assert r.status_code == 415
