"""The fake driver's VM: the real guest agent as a host process (`python -I -S fake_guest.py GUEST ROOT SOCK JOURNAL`).

GUEST is forkd/guest (the agent's modules, imported flatly as in a guest's /forkd), ROOT the per-VM directory that
becomes its root, SOCK the agent socket it listens on (the host end of the guest's port), JOURNAL the file its
Python requests are appended to. It binds SOCK, enters a mount and UTS namespace of its own, binds the host's
programs and libraries read-only (and /dev, /proc) into ROOT, chroots there, waits for one byte on stdin (the driver's
"resume": its `on_start` ran first), replays JOURNAL (a restored child's warm interpreter), then serves the
agent's own op table on SOCK, one host connection at a time, as QEMU's chardev does. Standard library only, no
forkd import (forkd/vmm/fake.py starts it and says what it does not model).

The ops that would change the host are replaced: `forked` and `clock` set no clock (the wall clock is the host's),
`fsfreeze` freezes nothing (ROOT's filesystem is the host's). The hostname is set in the UTS namespace.
"""

import ctypes
import json
import os
import socket
import sys

CLONE_NEWNS, CLONE_NEWUTS = 0x00020000, 0x04000000
MS_BIND, MS_REC, MS_RDONLY, MS_REMOUNT, MS_PRIVATE = 0x1000, 0x4000, 0x1, 0x20, 0x40000
READ_ONLY = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "etc")
WRITABLE = ("dev", "proc")
LIBC = ctypes.CDLL(None, use_errno=True)


def _check(rc, what):
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _bind(src, dest, read_only):
    _check(LIBC.mount(src.encode(), dest.encode(), None, MS_BIND | MS_REC, None), f"bind {src}")
    if read_only:
        _check(LIBC.mount(None, dest.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY, None), f"read-only {src}")


def enter_root(root):
    """A mount and UTS namespace of this process's own, the host's programs bound in, ROOT as /."""
    _check(LIBC.unshare(CLONE_NEWNS | CLONE_NEWUTS), "unshare")
    _check(LIBC.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    for name in READ_ONLY + WRITABLE:
        src = "/" + name
        if os.path.isdir(src) and not os.path.islink(src):
            os.makedirs(os.path.join(root, name), exist_ok=True)
            _bind(src, os.path.join(root, name), name in READ_ONLY)
        elif os.path.islink(src) and not os.path.lexists(os.path.join(root, name)):
            os.symlink(os.readlink(src), os.path.join(root, name))  # /bin -> usr/bin on merged-/usr hosts
    prefix = os.path.realpath(sys.base_prefix)  # this interpreter's stdlib, when it is not the system's
    if not any(prefix == "/" + d or prefix.startswith("/" + d + "/") for d in READ_ONLY):
        os.makedirs(root + prefix, exist_ok=True)
        _bind(prefix, root + prefix, True)
    for name in ("tmp", "root", "forkd"):
        os.makedirs(os.path.join(root, name), exist_ok=True)
    os.chroot(root)
    os.chdir("/")


class SocketPort:
    """The agent's Port over a listening unix socket: one host connection at a time; EOF waits for the next."""

    def __init__(self, agent, listener):
        self.agent, self.listener, self.conn = agent, listener, None
        self.buf = bytearray()

    def _fill(self, want=65536):
        if self.conn is None:
            self.conn, _ = self.listener.accept()
        try:
            chunk = self.conn.recv(min(max(want, 65536), 4 << 20))
        except OSError:
            chunk = b""
        if not chunk:  # the host went away: drop what it half sent, wait for the next one
            self.conn.close()
            self.conn = None
            del self.buf[:]
            return
        self.buf += chunk

    read_frame = None  # set below: the agent's own framing

    def write_frame(self, obj):
        data = json.dumps(obj).encode()
        with self.agent.WRITE_LOCK:
            conn = self.conn
            if conn is None:
                return  # no host: a virtio port drops it too
            try:
                conn.sendall(self.agent.MAGIC + len(data).to_bytes(4, "big") + data)
            except OSError:
                pass


def fake_ops(agent, journal_fd):
    """The agent's op table with the host-changing ops replaced and Python requests journaled."""
    import agent_ops

    def forked(args):
        entropy = args.get("entropy", "")
        if len(entropy) < 43:  # base64 of 32 bytes
            raise agent.RequestError("forked: at least 32 bytes of entropy are required")
        if "random" in sys.modules:
            sys.modules["random"].seed()
        agent_ops.STATE["child_id"] = args.get("child_id")
        if args.get("hostname"):
            socket.sethostname(args["hostname"])
        return {"child_id": agent_ops.STATE["child_id"], "hostname": socket.gethostname()}

    def journaled(op):
        def run(args):
            res = op(args)
            if res.get("error") is None and isinstance(args.get("code"), str):
                os.write(journal_fd, (json.dumps({"op": op.__name__, "code": args["code"]}) + "\n").encode())
            return res
        return run

    ops = dict(agent.OPS)
    ops.update(forked=forked, clock=lambda args: {"time": __import__("time").time()},
               fsfreeze=lambda args: {"frozen": True} if args.get("freeze") else {"thawed": False},
               eval=journaled(agent_ops.op_eval), exec_code=journaled(agent_ops.op_exec_code))
    return ops


def replay(entries):
    """Run the Python requests a restored VM's parent ran, in order: its warm interpreter's state again."""
    import agent_ops

    for e in entries:
        agent_ops._run_code(e["code"], "eval" if e["op"] == "op_eval" else "exec")


def main():
    guest, root, sock, journal = sys.argv[1:5]
    sys.path.insert(0, guest)
    import agent

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock)
    listener.listen(8)
    with open(journal) as f:
        entries = [json.loads(line) for line in f if line.strip()]
    journal_fd = os.open(journal, os.O_WRONLY | os.O_APPEND)
    enter_root(root)
    if sys.stdin.buffer.read(1) != b"g":  # the driver's resume; EOF: the driver gave up on this VM
        raise SystemExit("fake-guest: not resumed")
    replay(entries)
    agent.OPS = fake_ops(agent, journal_fd)
    SocketPort.read_frame = agent.Port.read_frame
    port = SocketPort(agent, listener)
    agent.Port = lambda path: port
    agent.find_port = lambda: sock
    print("forkd-agent: fake guest ready", flush=True)
    agent.main()


if __name__ == "__main__":
    main()
