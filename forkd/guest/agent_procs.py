"""The guest agent's processes (``proc_*`` ops; their host side is ``forkd/vmm/agent_client.py``): started with
``proc_start``, they outlive the request and the connection; their output waits in a bounded buffer per
process (``PROC_BUFFER`` bytes; a writer beyond it blocks, as on a full pipe) until the host reads it with
``proc_read``, which long-polls (one timed wait, no periodic wake-up while idle) and acknowledges what was read."""

import base64
import collections
import contextlib
import fcntl
import os
import pwd
import signal
import struct
import subprocess
import threading
import time

from agent_base import LIVE_PIDS, CannotRun, RequestError, reap_orphans

TIOCSWINSZ = 0x5414
TIOCSCTTY = 0x540E
MAX_PROCS = 64  # processes in the table: running, or exited with output or status not yet collected
PROC_BUFFER = 1 << 20  # unread output bytes held per process; beyond it the process blocks writing
MAX_READ = 1 << 20  # output bytes one proc_read returns
MAX_CHUNKS = 128  # output chunks one proc_read returns (adjacent chunks of one stream are merged)
MAX_WAIT = 60.0  # seconds one proc_read / proc_wait waits at most

PROCS = {}
PROCS_LOCK = threading.Lock()


class Proc:
    """A started process: its output waits in `chunks` (seq, stream, bytes) until a proc_read acknowledges it."""

    def __init__(self, popen, argv, tag, stdin_fd, pty, streams):
        self.popen, self.argv, self.tag = popen, argv, tag
        self.stdin_fd, self.pty = stdin_fd, pty  # stdin_fd: the pipe's or the PTY master's (a dup), until exit
        self.io = threading.Lock()  # held while stdin_fd is used or closed
        self.started = time.time()
        self.cond = threading.Condition()
        self.chunks = collections.deque()
        self.seq = 0
        self.buffered = 0
        self.open_streams = len(streams)
        self.exit_code = None
        self.dropped = False  # out of the table: its output is read and thrown away
        for name, fd in streams:
            threading.Thread(target=self.feed, args=(name, fd), daemon=True).start()
        threading.Thread(target=self.reap, daemon=True).start()

    def feed(self, stream, fd):
        try:
            while True:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # EIO: every holder of the PTY's other side closed it
                    data = b""
                if not data:
                    return
                with self.cond:
                    while self.buffered >= PROC_BUFFER and not self.dropped:
                        self.cond.wait()
                    if self.dropped:
                        continue
                    self.seq += 1
                    self.chunks.append((self.seq, stream, data))
                    self.buffered += len(data)
                    self.cond.notify_all()
        finally:
            os.close(fd)
            with self.cond:
                self.open_streams -= 1
                self.cond.notify_all()

    def reap(self):
        code = self.popen.wait()
        with self.cond:
            self.exit_code = code
            self.cond.notify_all()
        LIVE_PIDS.discard(self.popen.pid)
        self.close_stdin()
        reap_orphans()

    def close_stdin(self):
        with self.io:
            fd, self.stdin_fd = self.stdin_fd, None
            if fd is not None:
                os.close(fd)

    def write(self, data, eof):
        with self.io:
            fd = self.stdin_fd
            if fd is None:
                raise RequestError(f"process {self.popen.pid} has no open stdin (start it with stdin: true or a pty)")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if eof and self.pty:
                os.write(fd, b"\x04")
        if eof and not self.pty:
            self.close_stdin()

    def resize(self, size):
        with self.io:
            if not self.pty or self.stdin_fd is None:
                raise RequestError(f"process {self.popen.pid} has no pty (or has exited)")
            _set_size(self.stdin_fd, size)

    def finished(self):
        return self.exit_code is not None and self.open_streams == 0

    def read(self, after, max_bytes, wait):
        with self.cond:
            while self.chunks and self.chunks[0][0] <= after:
                self.buffered -= len(self.chunks.popleft()[2])
            self.cond.notify_all()
            if wait > 0 and not self.chunks and not self.finished():
                self.cond.wait(wait)
            out, size = [], 0
            for seq, stream, data in self.chunks:
                if out and size + len(data) > max_bytes:
                    break
                if out and out[-1][1] == stream:
                    out[-1][0], out[-1][2] = seq, out[-1][2] + data
                elif len(out) < MAX_CHUNKS:
                    out.append([seq, stream, data])
                else:
                    break
                size += len(data)
            n = sum(1 for c in self.chunks if c[0] <= out[-1][0]) if out else 0
            done = self.finished() and n == len(self.chunks)  # all output is in this reply
            return {"chunks": [[s, n, base64.b64encode(d).decode()] for s, n, d in out], "done": done,
                    "exit_code": self.exit_code if done else None}

    def row(self):
        """[pid, running, exit_code, started, pty, tag, argv (its first 4 items, 256 characters each)]: a
        listing of MAX_PROCS rows stays within the host's caps on strings per reply."""
        return [self.popen.pid, self.exit_code is None, self.exit_code, self.started, self.pty, self.tag,
                [a[:256] for a in self.argv[:4]]]


def _strings(value, what):
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise RequestError(f"{what} must be an object of strings")
    return value


LOGIN_SHELL = "/bin/bash"


def shell_argv(cmd):
    """A shell command's argv: `bash -l -c` as E2B runs commands, where this guest has bash (a `full` image), else
    `/bin/sh -c` (the default image is busybox). Decided per command: bash may be installed after the boot."""
    if os.access(LOGIN_SHELL, os.X_OK):
        return [LOGIN_SHELL, "-l", "-c", cmd]
    return ["/bin/sh", "-c", cmd]


def _proc_argv(args):
    argv, cmd = args.get("argv"), args.get("cmd")
    if cmd is not None:
        if not isinstance(cmd, str) or not cmd:
            raise RequestError("proc_start: 'cmd' must be a non-empty string (run by bash -l -c, or /bin/sh -c)")
        return shell_argv(cmd)
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise RequestError("proc_start: give 'argv' (a non-empty list of strings) or 'cmd' (a shell command)")
    return argv


def _set_size(fd, size):
    rows, cols = size.get("rows", 24), size.get("cols", 80)
    if not all(isinstance(v, int) and 0 < v < 10000 for v in (rows, cols)):
        raise RequestError("'rows' and 'cols' must be integers between 1 and 9999")
    fcntl.ioctl(fd, TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _make_ctty():
    fcntl.ioctl(0, TIOCSCTTY, 0)


def _as_user(user, env):
    """The Popen arguments that run a process as `user` (a name or a uid in /etc/passwd): its uid, its primary
    group and its supplementary groups (never the agent's root groups), and HOME, USER and LOGNAME from its
    passwd entry unless the request set them (as `docker exec -u` does)."""
    if not isinstance(user, str) or not user:
        raise RequestError("proc_start: 'user' must be a non-empty string (a name or a uid)")
    try:
        pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, OverflowError):
        raise CannotRun(f"unable to find user {user}: no matching entry in the guest's /etc/passwd", 126) from None
    for key, value in (("HOME", pw.pw_dir), ("USER", pw.pw_name), ("LOGNAME", pw.pw_name)):
        env.setdefault(key, value)
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": os.getgrouplist(pw.pw_name, pw.pw_gid)}


def _popen(argv, args, env, size, switch):
    """Start argv with stdin a pipe (stdin: true), a PTY (pty: {rows, cols}) or /dev/null; `switch`: _as_user's."""
    kw = {"env": env, "cwd": args.get("cwd") or "/", "start_new_session": True, **switch}
    if size is not None:
        master, slave = os.openpty()
        try:
            _set_size(slave, size)
            proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, preexec_fn=_make_ctty, **kw)
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        return proc, os.dup(master), True, [("stdout", master)]
    stdin = subprocess.PIPE if args.get("stdin") else subprocess.DEVNULL
    proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    stdin_fd = os.dup(proc.stdin.fileno()) if proc.stdin else None
    fds = [("stdout", os.dup(proc.stdout.fileno())), ("stderr", os.dup(proc.stderr.fileno()))]
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f:
            f.close()
    return proc, stdin_fd, False, fds


def _make_room():
    """Drop exited processes (oldest first) until there is room for one more; False if all are running."""
    with PROCS_LOCK:
        while len(PROCS) >= MAX_PROCS:
            done = [p for p in PROCS.values() if p.exit_code is not None]
            if not done:
                return False
            old = PROCS.pop(min(done, key=lambda p: p.started).popen.pid)
            with old.cond:
                old.dropped = True
                old.chunks.clear()
                old.buffered = 0
                old.cond.notify_all()
    return True


def op_proc_start(args):
    argv = _proc_argv(args)
    env = dict(os.environ)
    if args.get("user") is not None:
        for key in ("HOME", "USER", "LOGNAME"):  # PID 1's (root's): the user's own come from its passwd entry
            env.pop(key, None)
    env.update(_strings(args.get("env") or {}, "proc_start: 'env'"))
    switch = _as_user(args["user"], env) if args.get("user") is not None else {}
    size = args.get("pty")
    if size is not None and not isinstance(size, dict):
        raise RequestError("proc_start: 'pty' must be null or an object {rows, cols}")
    if size is not None:
        env.setdefault("TERM", "xterm-256color")
    tag = args.get("tag")
    if tag is not None and (not isinstance(tag, str) or len(tag) > 256):
        raise RequestError("proc_start: 'tag' must be a string of at most 256 characters")
    if not _make_room():
        raise RequestError(f"proc_start: {MAX_PROCS} processes are running already; kill one first")
    try:
        popen, stdin_fd, pty, streams = _popen(argv, args, env, size, switch)
    except FileNotFoundError as exc:
        raise CannotRun(f"{exc.filename or argv[0]}: not found", 127) from None
    except (PermissionError, NotADirectoryError, KeyError, OSError) as exc:
        raise CannotRun(f"cannot run {argv[0]}: {exc}", 126) from None
    LIVE_PIDS.add(popen.pid)
    proc = Proc(popen, argv, tag, stdin_fd, pty, streams)
    with PROCS_LOCK:
        PROCS[popen.pid] = proc
    return {"pid": popen.pid}


def _proc(args):
    pid = args.get("pid")
    proc = PROCS.get(pid) if isinstance(pid, int) else None
    if proc is None:
        raise RequestError(f"no process {pid!r} (see proc_list)")
    return proc


def _number(args, key, default, hi):
    v = args.get(key, default)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
        raise RequestError(f"'{key}' must be a non-negative number")
    return min(v, hi)


def op_proc_read(args):
    proc = _proc(args)
    after = args.get("after", 0)
    if not isinstance(after, int):
        raise RequestError("proc_read: 'after' must be an integer")
    res = proc.read(after, int(_number(args, "max_bytes", MAX_READ, MAX_READ)) or 1, _number(args, "wait", 0, MAX_WAIT))
    res["pid"] = proc.popen.pid
    return res


def op_proc_write(args):
    proc = _proc(args)
    data = base64.b64decode(args.get("data") or "")
    proc.write(data, bool(args.get("eof")))
    return {"written": len(data)}


def op_proc_resize(args):
    proc = _proc(args)
    proc.resize(args)
    return {"pid": proc.popen.pid}


def op_proc_signal(args):
    proc = _proc(args)
    sig = args.get("signal", "SIGTERM")
    try:
        num = int(getattr(signal, sig)) if isinstance(sig, str) and sig.startswith("SIG") else int(sig)
    except (AttributeError, TypeError, ValueError):
        raise RequestError(f"unknown signal {sig!r}") from None
    sent = proc.exit_code is None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.popen.pid, num)
    return {"pid": proc.popen.pid, "sent": sent}


def op_proc_kill(args):
    return op_proc_signal({"pid": args.get("pid"), "signal": int(signal.SIGKILL)})


def op_proc_wait(args):
    proc = _proc(args)
    with proc.cond:
        if proc.exit_code is None:
            proc.cond.wait_for(lambda: proc.exit_code is not None, _number(args, "timeout", MAX_WAIT, MAX_WAIT))
    return {"process": proc.row()}


def op_proc_list(args):
    with PROCS_LOCK:
        procs = list(PROCS.values())
    return {"processes": [p.row() for p in procs]}
