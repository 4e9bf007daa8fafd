"""forkd/guest/users.py, the adduser/userdel of the default guest image (its busybox has neither), on a scratch
/etc: the files it writes are what getpwnam reads, a second user gets the next uid, bad names and ':' are
refused, userdel removes the user, its group, its group memberships and (with -r) its home."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from forkd.image.build import GUEST_DIR


@pytest.fixture
def users(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("forkd_guest_users", GUEST_DIR / "users.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (etc / "group").write_text("root:x:0:\nwheel:x:10:root,agent\n")
    monkeypatch.setattr(mod, "ETC", str(etc))

    def run(verb: str, *args: str) -> int:
        monkeypatch.setattr(sys, "argv", [f"/usr/sbin/{verb}", *args])
        try:
            return mod.main()
        except SystemExit as exc:
            return exc.code

    run.etc = etc
    return run


def _rows(path) -> list[list[str]]:
    return [line.split(":") for line in path.read_text().splitlines()]


def test_adduser_then_userdel(users, tmp_path):
    home = tmp_path / "home" / "agent"
    assert users("adduser", "--comment", "self_check.py", "--disabled-password", "--home", str(home), "agent") == 0
    assert ["agent", "x", "1000", "1000", "self_check.py", str(home), "/bin/sh"] in _rows(users.etc / "passwd")
    assert ["agent", "x", "1000", ""] in _rows(users.etc / "group")
    assert home.is_dir() and home.stat().st_uid == 1000 and home.stat().st_gid == 1000
    assert users("adduser", "-D", "-H", "second") == 0  # busybox's spelling; the next free id
    assert ["second", "x", "1001", "1001", "", "/home/second", "/bin/sh"] in _rows(users.etc / "passwd")
    assert users("adduser", "-D", "-H", "agent") == 1  # in use
    assert users("userdel", "-r", "agent") == 0
    assert "agent" not in [r[0] for r in _rows(users.etc / "passwd")]
    assert _rows(users.etc / "group") == [["root", "x", "0", ""], ["wheel", "x", "10", "root"],
                                          ["second", "x", "1001", ""]]
    assert not home.exists()
    assert users("deluser", "agent") == 6  # gone already: userdel's code for "no such user"
    assert not [p for p in os.listdir(users.etc) if ".forkd-" in p]  # no temporaries left


@pytest.mark.parametrize("args", [["-D", "Bad:Name"], ["-D", "-g", "a:b", "ok"], ["-D", "x" * 33]])
def test_adduser_refuses_what_would_corrupt_passwd(users, args):
    before = (users.etc / "passwd").read_text()
    assert users("adduser", "-H", *args) != 0
    assert (users.etc / "passwd").read_text() == before


def test_adduser_help_is_not_busybox(users, capsys):
    """Inspect's exec-as-user check picks busybox's flags only if `adduser --help` says BusyBox: this one takes
    the Debian spelling (and busybox's -D)."""
    assert users("adduser", "--help") == 0
    out = capsys.readouterr().out
    assert "--disabled-password" in out and "BusyBox" not in out
