"""A guest's tar answers only the question asked (SECURITY.md section 1): the checks of forkd.base.taranswer and the
staging of forkd.base.tarsafe, on tars crafted here as a hostile guest would make them. No VM: the same functions
run on every download path (AgentFiles.tar_read, the archive route, `forkd cp`); tests/security/test_files_guest.py
shows the same attacks through a real guest."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from forkd.base.errors import InvalidInput
from forkd.base.taranswer import answer_only, top_name
from forkd.base.tarsafe import extract
from forkd.client.copy import _to_stdout
from tests.security.test_files_guest import MAKE_TAR

_ns: dict = {}
exec(MAKE_TAR, _ns)  # noqa: S102 - the builder the hostile guest of test_files_guest.py runs, run here
make_tar = _ns["make_tar"]  # (name, kind, value): file (text), dir, sym/hard (target), zeros (size), dirdata


def chunks(data: bytes, size: int = 700) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def snapshot(d: Path) -> dict[str, bytes | str]:
    """Every entry under `d` (links as their targets), to show a refused copy changed nothing."""
    out: dict[str, bytes | str] = {}
    for p in sorted(d.rglob("*")):
        rel = str(p.relative_to(d))
        out[rel] = ("->" + os.readlink(p)) if p.is_symlink() else ("dir" if p.is_dir() else p.read_bytes())
    return out


# what a guest asked for /root/result.txt answers, why it is refused, and how many members lead honestly
HOSTILE = [
    ("dotfiles beside the answer", [("result.txt", "file", "ok"), (".bashrc", "file", "pwned"),
                                    (".ssh/authorized_keys", "file", "ssh-ed25519 AAAA attacker")], "not beneath", 1),
    ("a second top entry after it", [("result.txt", "file", "ok"), ("result.txt.bak", "file", "x")], "not beneath", 1),
    ("another name only", [(".git/hooks/pre-commit", "file", "#!/bin/sh\ncurl evil")], "not beneath", 0),
    ("dot-slash prefixed outsider", [("result.txt", "file", "ok"), ("./.bashrc", "file", "x")], "not beneath", 1),
    ("climbing out", [("result.txt", "file", "ok"), ("result.txt/../../x", "file", "x")], "climbs out", 1),
    ("absolute", [("result.txt", "file", "ok"), ("/etc/x", "file", "x")], "absolute", 1),
    ("hard link out of the answer", [("result.txt", "file", "ok"), ("result.txt2", "hard", ".bashrc")],
     "not beneath", 1),
    ("hard link to an outsider", [("result.txt", "dir", None), ("result.txt/l", "hard", ".bashrc")], "hard link", 1),
    ("a directory carrying data", [("result.txt", "dirdata", "x" * 600), ("result.txt/a", "file", "x")],
     "carries 600 bytes", 0),
]
CASES = [pytest.param(*h[1:], id=h[0]) for h in HOSTILE]


@pytest.mark.parametrize("members,match,honest", CASES)
def test_a_hostile_answer_fails_the_copy_and_writes_nothing(tmp_path, members, match, honest):
    dest = tmp_path / "dest"
    (dest / ".ssh").mkdir(parents=True)
    (dest / ".bashrc").write_text("mine")
    (dest / ".ssh" / "authorized_keys").write_text("my key")
    before = snapshot(dest)
    with pytest.raises(InvalidInput, match=match):
        extract(chunks(make_tar(members)), dest, "result.txt")
    assert snapshot(dest) == before  # not even the valid member, not the staging directory


@pytest.mark.parametrize("members,match,honest", CASES)
def test_a_hostile_answer_passes_no_byte_of_a_refused_member(members, match, honest):
    tar = make_tar(members)
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        refused_at = t.getmembers()[honest].offset  # where the first refused member's headers begin
    passed = bytearray()
    with pytest.raises(InvalidInput, match=match):
        for c in answer_only(chunks(tar, 37), "result.txt"):
            passed += c
    assert len(passed) <= refused_at and tar.startswith(passed)


def test_a_hostile_answer_writes_nothing_to_stdout():
    out = io.BytesIO()
    tar = make_tar([("result.txt", "file", "ok" * 5000), (".bashrc", "file", "pwned")])
    with pytest.raises(InvalidInput, match="not beneath"):
        _to_stdout(answer_only(chunks(tar), "result.txt"), out, 1 << 30)
    assert out.getvalue() == b""


def test_an_honest_answer_passes_whole_and_ends_the_archive():
    tar = make_tar([("proj", "dir", None), ("proj/a.txt", "file", "alpha" * 999), ("proj/l", "sym", "../../etc"),
                    ("proj/sub", "dir", None), ("proj/sub/h", "hard", "proj/a.txt")])
    passed = b"".join(answer_only(chunks(tar, 333), "proj"))
    with tarfile.open(fileobj=io.BytesIO(passed)) as t:
        assert t.getnames() == ["proj", "proj/a.txt", "proj/l", "proj/sub", "proj/sub/h"]
        assert t.extractfile("proj/a.txt").read() == b"alpha" * 999


def test_trailing_bytes_after_the_archive_are_not_passed_on():
    tar = make_tar([("r", "file", "ok")]) + b"JUNK" * 5000
    passed = b"".join(answer_only(chunks(tar), "r"))
    assert b"JUNK" not in passed


def test_an_empty_answer_is_refused(tmp_path):
    with pytest.raises(InvalidInput):
        b"".join(answer_only([bytes(1024)], "r"))
    with pytest.raises(InvalidInput):
        extract([bytes(1024)], tmp_path, "r")
    assert list(tmp_path.iterdir()) == []


def test_top_name_is_the_last_component_and_the_root_names_none():
    assert top_name("/root/result.txt") == "result.txt" and top_name("/root/dir/") == "dir"
    for bad in ("/", "//", "/root/.."):
        with pytest.raises(InvalidInput):
            top_name(bad)


def test_an_existing_file_is_replaced_by_rename_never_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("original")
    dest = tmp_path / "dest"
    dest.mkdir()
    os.link(victim, dest / "result.txt")  # the destination's file shares its inode with a victim
    os.symlink(victim, dest / "other.txt")
    extract(chunks(make_tar([("result.txt", "file", "new")])), dest, "result.txt")
    extract(chunks(make_tar([("result.txt", "file", "newer")])), dest, "result.txt", "other.txt")
    assert victim.read_text() == "original"
    assert (dest / "result.txt").read_text() == "new"
    assert not (dest / "other.txt").is_symlink() and (dest / "other.txt").read_text() == "newer"


def test_a_directory_merges_into_one_of_its_name(tmp_path):
    dest = tmp_path / "dest"
    (dest / "proj" / "keep").mkdir(parents=True)
    (dest / "proj" / "keep" / "mine.txt").write_text("mine")
    (dest / "proj" / "a.txt").write_text("old")
    tar = make_tar([("proj", "dir", None), ("proj/a.txt", "file", "new"), ("proj/keep", "dir", None),
                    ("proj/keep/theirs.txt", "file", "t"), ("proj/new", "dir", None), ("proj/new/n", "file", "n")])
    out = extract(chunks(tar), dest, "proj")
    assert (out.files, out.dirs) == (3, 3)
    assert snapshot(dest) == {"proj": "dir", "proj/a.txt": b"new", "proj/keep": "dir", "proj/keep/mine.txt": b"mine",
                              "proj/keep/theirs.txt": b"t", "proj/new": "dir", "proj/new/n": b"n"}


def test_a_kind_conflict_inside_a_merge_moves_nothing(tmp_path):
    dest = tmp_path / "dest"
    (dest / "proj" / "x").mkdir(parents=True)  # a directory where the copy has a file
    (dest / "proj" / "a.txt").write_text("old")
    before = snapshot(dest)
    tar = make_tar([("proj", "dir", None), ("proj/a.txt", "file", "new"), ("proj/x", "file", "file")])
    with pytest.raises(InvalidInput, match="exists as a directory"):
        extract(chunks(tar), dest, "proj")
    assert snapshot(dest) == before


def test_directory_modes_apply_to_what_the_copy_made_not_to_what_was_there(tmp_path):
    dest = tmp_path / "dest"
    (dest / "proj").mkdir(parents=True)
    os.chmod(dest / "proj", 0o750)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, mode in (("proj", 0o777), ("proj/ro", 0o500)):
            ti = tarfile.TarInfo(name)
            ti.type, ti.mode = tarfile.DIRTYPE, mode
            t.addfile(ti)
    extract(chunks(buf.getvalue()), dest, "proj")
    assert (dest / "proj").stat().st_mode & 0o777 == 0o750
    assert (dest / "proj" / "ro").stat().st_mode & 0o777 == 0o500
