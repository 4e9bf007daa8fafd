#!/usr/bin/python3
"""adduser and userdel for forkd's default guest image, whose busybox build has neither (installed as
/usr/sbin/adduser, /usr/sbin/userdel and /usr/sbin/deluser; this file picks its verb by the name it runs as).

    adduser [-D|--disabled-password] [--comment TEXT] [--home DIR] [--shell SH] [--uid N] [-H] NAME
    userdel [-r] NAME            deluser [--remove-home] NAME

Only the local files: /etc/passwd and /etc/group (a group of the user's name, its gid the uid), no passwords
(every account is locked, as `--disabled-password` makes it), no /etc/shadow. Each file is rewritten whole
(a temporary beside it, then rename) under a lock on /etc/.pwd.lock. Images with their own adduser (Debian,
OCI) keep theirs."""

import argparse
import fcntl
import os
import re
import shutil
import sys

ETC = "/etc"
NAME = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
FIRST_UID = 1000


def fail(msg, code=1):
    print(f"{os.path.basename(sys.argv[0])}: {msg}", file=sys.stderr)
    sys.exit(code)


def read_table(name):
    try:
        with open(os.path.join(ETC, name)) as f:
            return [line.rstrip("\n").split(":") for line in f if line.strip()]
    except FileNotFoundError:
        return []


def write_table(name, rows, mode=0o644):
    path = os.path.join(ETC, name)
    tmp = f"{path}.forkd-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write("".join(":".join(r) + "\n" for r in rows))
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def locked():
    fd = os.open(os.path.join(ETC, ".pwd.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def add_parser():
    p = argparse.ArgumentParser(prog="adduser", description="Add a local user (forkd's guest: no passwords).",
                                add_help=False)
    p.add_argument("-D", "--disabled-password", "--disabled-login", action="store_true", dest="disabled",
                   help="no password (every account here is locked; accepted for compatibility)")
    p.add_argument("-g", "--comment", "--gecos", default="", help="the GECOS field")
    p.add_argument("-h", "--home", help="home directory (default /home/NAME)")
    p.add_argument("-s", "--shell", default="/bin/sh", help="login shell (default /bin/sh)")
    p.add_argument("-u", "--uid", type=int, help="user id (default: the next free one from 1000)")
    p.add_argument("-H", "--no-create-home", action="store_true", help="do not create the home directory")
    p.add_argument("name")
    return p


def adduser(argv):
    p = add_parser()
    if "--help" in argv:
        p.print_help()
        return 0
    a = p.parse_args(argv)
    if not NAME.match(a.name):
        fail(f"invalid user name {a.name!r} (lower case letters, digits, '_', '.', '-'; at most 32)")
    if any(c in a.comment + (a.home or "") + a.shell for c in ":\n"):
        fail("':' and newlines are not allowed in --comment, --home or --shell")
    home = a.home or f"/home/{a.name}"
    fd = locked()
    try:
        users, groups = read_table("passwd"), read_table("group")
        if any(r[0] == a.name for r in users):
            fail(f"user '{a.name}' in use", 1)
        taken = {int(r[2]) for r in users if len(r) > 2 and r[2].isdigit()}
        taken |= {int(r[2]) for r in groups if len(r) > 2 and r[2].isdigit()}
        uid = a.uid if a.uid is not None else next(i for i in range(FIRST_UID, 60000) if i not in taken)
        if a.uid is not None and any(len(r) > 2 and r[2] == str(uid) for r in users):
            fail(f"uid {uid} in use", 1)
        if not any(r[0] == a.name for r in groups):
            write_table("group", groups + [[a.name, "x", str(uid), ""]])
        write_table("passwd", users + [[a.name, "x", str(uid), str(uid), a.comment, home, a.shell]])
    finally:
        os.close(fd)
    if not a.no_create_home and not os.path.exists(home):
        os.makedirs(home, mode=0o755)
        os.chown(home, uid, uid)
    return 0


def userdel(argv):
    p = argparse.ArgumentParser(prog="userdel", description="Remove a local user (and its group of the same name).")
    p.add_argument("-r", "--remove", "--remove-home", action="store_true", dest="remove",
                   help="also remove the user's home directory")
    p.add_argument("name")
    a = p.parse_args(argv)
    fd = locked()
    try:
        users = read_table("passwd")
        entry = next((r for r in users if r[0] == a.name), None)
        if entry is None:
            fail(f"user '{a.name}' does not exist", 6)
        write_table("passwd", [r for r in users if r[0] != a.name])
        groups = [r for r in read_table("group") if not (r[0] == a.name and len(r) > 2 and r[2] == entry[3])]
        for r in groups:
            if len(r) > 3:
                r[3] = ",".join(m for m in r[3].split(",") if m and m != a.name)
        write_table("group", groups)
    finally:
        os.close(fd)
    if a.remove and len(entry) > 5 and entry[5] not in ("", "/"):
        shutil.rmtree(entry[5], ignore_errors=True)
    return 0


def main():
    verb = os.path.basename(sys.argv[0])
    if verb in ("userdel", "deluser"):
        return userdel(sys.argv[1:])
    return adduser(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
