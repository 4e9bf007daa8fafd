"""forkd guest agent: PID 1 inside the microVM (stdlib only, runs on the guest's Python 3.11).

Transport: the virtio-serial port named ``forkd.agent`` (never a guest TCP port). Frames are
``b"FKD1" + 4-byte big-endian length + UTF-8 JSON``. The magic lets either side resynchronise
after a host disconnect cut a frame in half (the guest writes at most 32 KiB per write).

Requests: ``{"id": N, "op": "...", "args": {...}}``. Replies: ``{"id": N, "ok": true, "result": ...}``
or ``{"id": N, "ok": false, "error": {"type", "message", "traceback"}}``. A malformed or unknown
request gets an error reply and the agent keeps serving.

Several requests may be in flight on one connection: ops that block (``exec`` and the ``proc_*`` ops that
wait: ``proc_read``, ``proc_wait``, ``proc_write``) run on their own thread and answer when done, the others
inline; the host matches replies to requests by id.

Processes (``proc_*`` ops; their host side is ``forkd/vmm/agent_client.py``): started with
``proc_start``, they outlive the request and the connection; their output waits in a bounded buffer per
process (``PROC_BUFFER`` bytes; a writer beyond it blocks, as on a full pipe) until the host reads it with
``proc_read``, which long-polls (one timed wait, no periodic wake-up while idle) and acknowledges what was read.

When no host is connected, read() on the port returns EOF at once; the agent then blocks in
sigtimedwait(SIGIO) (the port is O_ASYNC), which the kernel raises when the host connects.
"""

import base64
import builtins
import collections
import contextlib
import fcntl
import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback

PORT_NAME = "forkd.agent"
MAGIC = b"FKD1"
MAX_FRAME = 64 << 20
DEFAULT_OUTPUT_CAP = 1 << 20
RNDADDENTROPY = 0x40085203
RNDRESEEDCRNG = 0x5207
FIFREEZE = 0xC0045877
FITHAW = 0xC0045878
TIOCSWINSZ = 0x5414
TIOCSCTTY = 0x540E
MAX_PROCS = 64  # processes in the table: running, or exited with output or status not yet collected
PROC_BUFFER = 1 << 20  # unread output bytes held per process; beyond it the process blocks writing
MAX_READ = 1 << 20  # output bytes one proc_read returns
MAX_CHUNKS = 128  # output chunks one proc_read returns (adjacent chunks of one stream are merged)
MAX_WAIT = 60.0  # seconds one proc_read / proc_wait waits at most
MAX_HANDLERS = 256  # requests served on their own thread at once

NS = {"__name__": "__forkd__", "__builtins__": builtins}
STATE = {"child_id": None, "boot": time.monotonic(), "thaw_timer": None}
EVAL_LOCK = threading.Lock()
WRITE_LOCK = threading.Lock()
FREEZE_LOCK = threading.Lock()
LIVE_PIDS = set()
PROCS = {}
PROCS_LOCK = threading.Lock()
HANDLERS = threading.BoundedSemaphore(MAX_HANDLERS)


class RequestError(Exception):
    """An error that is the caller's fault (bad arguments); reported, never fatal."""


class CannotRun(RequestError):
    """A process that could not be started: its error reply carries the shell's exit code (126 or 127)."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


def find_port():
    base = "/sys/class/virtio-ports"
    for _ in range(500):
        if os.path.isdir(base):
            for d in sorted(os.listdir(base)):
                try:
                    with open(os.path.join(base, d, "name")) as f:
                        if f.read().strip() == PORT_NAME:
                            return "/dev/" + d
                except OSError:
                    pass
        time.sleep(0.01)
    raise SystemExit(f"forkd-agent: virtio port {PORT_NAME} not found")


# ---------------------------------------------------------------- ops


def op_ping(args):
    return {"pong": True, "pid": os.getpid(), "child_id": STATE["child_id"],
            "uptime": time.monotonic() - STATE["boot"]}


def _cap(data, cap):
    if len(data) > cap:
        return data[:cap].decode("utf-8", "replace"), True
    return data.decode("utf-8", "replace"), False


def op_exec(args):
    argv = args.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise RequestError("exec: 'argv' must be a non-empty list of strings")
    env = dict(os.environ)
    env.update(args.get("env") or {})
    stdin = args.get("stdin")
    stdin_bytes = stdin.encode() if isinstance(stdin, str) else b""
    timeout = args.get("timeout")
    cap = int(args.get("max_output", DEFAULT_OUTPUT_CAP))
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(argv, env=env, cwd=args.get("cwd") or "/", stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        code = 127 if isinstance(exc, FileNotFoundError) and exc.filename == argv[0] else 126
        return {"stdout": "", "stderr": f"forkd-agent: {argv[0]}: {exc.strerror}\n", "exit_code": code,
                "timed_out": False, "truncated": False, "duration_ms": (time.monotonic() - t0) * 1000.0}
    LIVE_PIDS.add(proc.pid)
    timed_out = False
    try:
        out, err = proc.communicate(stdin_bytes, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    finally:
        LIVE_PIDS.discard(proc.pid)
        reap_orphans()
    stdout, t1 = _cap(out, cap)
    stderr, t2 = _cap(err, cap)
    return {"stdout": stdout, "stderr": stderr, "exit_code": proc.returncode,
            "timed_out": timed_out, "truncated": t1 or t2,
            "duration_ms": (time.monotonic() - t0) * 1000.0}


def _run_code(code, mode, cap=DEFAULT_OUTPUT_CAP):
    """Run user code in the agent's namespace; stdout, stderr and the value's repr are cut to `cap` characters
    (the host refuses frames over its own cap and cuts outputs again)."""
    if not isinstance(code, str):
        raise RequestError("'code' must be a string")
    out, err = io.StringIO(), io.StringIO()
    value, error = None, None
    with EVAL_LOCK, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            compiled = compile(code, f"<forkd-{mode}>", mode)
            result = eval(compiled, NS) if mode == "eval" else exec(compiled, NS)  # noqa: S307
            if mode == "eval":
                value = repr(result)
        except BaseException as exc:  # the user's code may raise anything, SystemExit included
            tb = exc.__traceback__.tb_next or exc.__traceback__  # drop the agent's own frame
            error = {"type": type(exc).__name__, "message": str(exc),
                     "traceback": "".join(traceback.format_exception(type(exc), exc, tb))}
    res = {"value": value, "stdout": out.getvalue(), "stderr": err.getvalue(), "error": error, "truncated": False}
    for k in ("value", "stdout", "stderr"):
        if isinstance(res[k], str) and len(res[k]) > cap:
            res[k], res["truncated"] = res[k][:cap], True
    if error and len(error["message"]) + len(error["traceback"]) > cap:
        error["message"], error["traceback"], res["truncated"] = error["message"][:cap // 2], \
            error["traceback"][-cap // 2:], True
    return res


def op_eval(args):
    return _run_code(args.get("code"), "eval", int(args.get("max_output", DEFAULT_OUTPUT_CAP)))


def op_exec_code(args):
    return _run_code(args.get("code"), "exec", int(args.get("max_output", DEFAULT_OUTPUT_CAP)))


def op_write_file(args):
    path = args.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise RequestError("write_file: 'path' must be an absolute path")
    data = base64.b64decode(args.get("data", ""))
    if args.get("mkdir", True):
        os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
    tmp = f"{path}.forkd-tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, int(args.get("mode", 0o644)))
    os.replace(tmp, path)
    return {"path": path, "size": len(data)}


def op_read_file(args):
    path = args.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise RequestError("read_file: 'path' must be an absolute path")
    limit = int(args.get("max_bytes", 16 << 20))
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    return {"path": path, "data": base64.b64encode(data[:limit]).decode(), "truncated": len(data) > limit}


def _thaw():
    with FREEZE_LOCK:
        timer, STATE["thaw_timer"] = STATE["thaw_timer"], None
    if timer is None:
        return False
    timer.cancel()
    fd = os.open("/", os.O_RDONLY)
    try:
        fcntl.ioctl(fd, FITHAW, 0)
    except OSError:
        pass  # already thawed (by the timer)
    finally:
        os.close(fd)
    return True


def op_fsfreeze(args):
    """Freeze the root filesystem (written back and flushed to the disk, then every writer waits) or thaw it.
    Used by the host to copy a disk-backed guest's overlay while the guest runs. A freeze thaws itself after
    `max_seconds` whatever becomes of the host; a child restored from a frozen instant thaws in `forked`."""
    if not args.get("freeze"):
        return {"thawed": _thaw()}
    with FREEZE_LOCK:
        if STATE["thaw_timer"] is not None:
            raise RequestError("fsfreeze: the root filesystem is frozen already")
        fd = os.open("/", os.O_RDONLY)
        try:
            fcntl.ioctl(fd, FIFREEZE, 0)
        finally:
            os.close(fd)
        timer = threading.Timer(float(args.get("max_seconds", 10.0)), _thaw)
        timer.daemon = True
        STATE["thaw_timer"] = timer
        timer.start()
    return {"frozen": True}


def op_forked(args):
    """First call in a fresh child: new entropy, identity and clock (and a thawed filesystem)."""
    _thaw()
    entropy = base64.b64decode(args.get("entropy", ""))
    if len(entropy) < 32:
        raise RequestError("forked: at least 32 bytes of entropy are required")
    with open("/dev/urandom", "wb") as f:
        fcntl.ioctl(f, RNDADDENTROPY, struct.pack("ii", len(entropy) * 8, len(entropy)) + entropy)
        fcntl.ioctl(f, RNDRESEEDCRNG)
    if "random" in sys.modules:  # the warm interpreter's PRNG was seeded in the parent
        sys.modules["random"].seed()
    STATE["child_id"] = args.get("child_id")
    if args.get("hostname"):
        socket.sethostname(args["hostname"])
    if args.get("time"):
        time.clock_settime(time.CLOCK_REALTIME, float(args["time"]))
    return {"child_id": STATE["child_id"], "hostname": socket.gethostname()}


# ---------------------------------------------------------------- processes


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


def _proc_argv(args):
    argv, cmd = args.get("argv"), args.get("cmd")
    if cmd is not None:
        if not isinstance(cmd, str) or not cmd:
            raise RequestError("proc_start: 'cmd' must be a non-empty string (run by /bin/sh -c)")
        return ["/bin/sh", "-c", cmd]
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


def _popen(argv, args, env, size):
    """Start argv with stdin a pipe (stdin: true), a PTY (pty: {rows, cols}) or /dev/null."""
    kw = {"env": env, "cwd": args.get("cwd") or "/", "start_new_session": True}
    if args.get("user") is not None:
        kw["user"] = args["user"]
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
    env.update(_strings(args.get("env") or {}, "proc_start: 'env'"))
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
        popen, stdin_fd, pty, streams = _popen(argv, args, env, size)
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


OPS = {"ping": op_ping, "exec": op_exec, "eval": op_eval, "exec_code": op_exec_code,
       "write_file": op_write_file, "read_file": op_read_file, "forked": op_forked, "fsfreeze": op_fsfreeze,
       "proc_start": op_proc_start, "proc_read": op_proc_read, "proc_write": op_proc_write,
       "proc_resize": op_proc_resize, "proc_signal": op_proc_signal, "proc_kill": op_proc_kill,
       "proc_wait": op_proc_wait, "proc_list": op_proc_list}
# ops that may block: served on their own thread (at most MAX_HANDLERS at once), the others inline
THREADED = (b'"op": "exec"', b'"op": "proc_read"', b'"op": "proc_wait"', b'"op": "proc_write"',
            b'"op": "fs_read"', b'"op": "fs_write"', b'"op": "fs_stream_', b'"op": "fs_tar_open"')


# ---------------------------------------------------------------- files (helper agent-files: one block)
# list, stat, remove, rename, mkdir, chmod; reads and writes by offset in bounded chunks (any size streams as many
# request/response pairs); tar streams (a thread writes/reads a pipe, the host pulls/pushes bounded chunks); and
# watches of a directory: inotify through ctypes when the guest's Python has it, else a polling diff of a walk.
# Every op is one request and one reply, independent of the transport.

FS_CHUNK_MAX = 4 << 20  # bytes of one read/write chunk
FS_LIST_MAX = 200  # entries of one list page (2 strings each: the host parses at most 512 strings a reply)
FS_EVENTS_MAX = 200  # events of one watch poll (2 strings each)
FS_QUEUE_MAX = 8192  # events a watch keeps between polls (more: the oldest are dropped, `overflow` says so)
FS_WALK_MAX = 20000  # entries a polling watch compares
FS_STREAMS = {}
FS_WATCHES = {}
FS_IDS = [0]


def _fs_id():
    FS_IDS[0] += 1
    return FS_IDS[0]


def _fs_path(args, key="path"):
    p = args.get(key)
    if not isinstance(p, str) or not p.startswith("/") or "\0" in p:
        raise RequestError(f"'{key}' must be an absolute path")
    return p


def _fs_int(args, key, default, lo, hi):
    v = args.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise RequestError(f"'{key}' must be an integer in [{lo}, {hi}]")
    return v


def _fs_type(mode):
    import stat as st
    return "dir" if st.S_ISDIR(mode) else "file" if st.S_ISREG(mode) else "symlink" if st.S_ISLNK(mode) \
        else "other"


def op_fs_stat(args):
    path = _fs_path(args)
    s = os.lstat(path)
    kind = _fs_type(s.st_mode)
    return {"path": path, "type": kind, "size": s.st_size, "mode": s.st_mode & 0o7777, "mtime": s.st_mtime,
            "target": os.readlink(path) if kind == "symlink" else None}


def op_fs_list(args):
    """One page of a directory: entries [name, type, size, mode, mtime] with names after `after`, sorted."""
    path = _fs_path(args)
    after = args.get("after") or ""
    limit = _fs_int(args, "limit", FS_LIST_MAX, 1, FS_LIST_MAX)
    names = sorted(n for n in os.listdir(path) if n > after)
    out = []
    for n in names[:limit]:
        try:
            s = os.lstat(os.path.join(path, n))
        except FileNotFoundError:
            continue
        out.append([n, _fs_type(s.st_mode), s.st_size, s.st_mode & 0o7777, s.st_mtime])
    return {"entries": out, "more": len(names) > limit, "last": names[:limit][-1] if names else None}


def op_fs_remove(args):
    path = _fs_path(args)
    if os.path.normpath(path) == "/":
        raise RequestError("fs_remove: refusing to remove /")
    if os.path.isdir(path) and not os.path.islink(path):
        if args.get("recursive"):
            import shutil
            shutil.rmtree(path)
        else:
            os.rmdir(path)
    else:
        os.unlink(path)
    return {"path": path}


def op_fs_rename(args):
    src, dst = _fs_path(args, "src"), _fs_path(args, "dst")
    os.rename(src, dst)
    return {"path": dst}


def op_fs_mkdir(args):
    path = _fs_path(args)
    mode = _fs_int(args, "mode", 0o755, 0, 0o7777)
    if os.path.isdir(path):
        return {"path": path, "created": False}
    if args.get("parents", True):
        os.makedirs(path, mode)
    else:
        os.mkdir(path, mode)
    return {"path": path, "created": True}


def op_fs_chmod(args):
    path = _fs_path(args)
    os.chmod(path, _fs_int(args, "mode", None, 0, 0o7777))
    return {"path": path}


def op_fs_read(args):
    """`length` bytes of `path` from `offset`; `eof` when fewer were there."""
    path = _fs_path(args)
    offset = _fs_int(args, "offset", 0, 0, 1 << 62)
    length = _fs_int(args, "length", 1 << 20, 1, FS_CHUNK_MAX)
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    return {"data": base64.b64encode(data).decode(), "eof": len(data) < length}


def _fs_upload_tmp(path, token):
    if not isinstance(token, str) or not 8 <= len(token) <= 64 or not all(c in "0123456789abcdef" for c in token):
        raise RequestError("'upload' must be 8 to 64 lowercase hex digits")
    d, base = os.path.split(path)
    if not base:
        raise RequestError("'path' names a directory, not a file")
    return os.path.join(d, f".{base}.forkd-{token}")


def op_fs_write(args):
    """Chunk `data` of upload `upload` at `offset` (0 starts it, in order); `done` makes it `path` atomically."""
    path = _fs_path(args)
    tmp = _fs_upload_tmp(path, args.get("upload"))
    offset = _fs_int(args, "offset", 0, 0, 1 << 62)
    data = base64.b64decode(args.get("data", ""))
    if len(data) > FS_CHUNK_MAX:
        raise RequestError(f"fs_write: a chunk holds at most {FS_CHUNK_MAX} bytes")
    if offset == 0 and args.get("mkdir", True):
        os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT | os.O_TRUNC if offset == 0 else 0)
    fd = os.open(tmp, flags, 0o600)
    try:
        if os.fstat(fd).st_size != offset:
            raise RequestError(f"fs_write: chunk at {offset} out of order (have {os.fstat(fd).st_size} bytes)")
        os.lseek(fd, offset, os.SEEK_SET)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if args.get("done"):
            os.fchmod(fd, _fs_int(args, "mode", 0o644, 0, 0o7777))
    finally:
        os.close(fd)
    if args.get("done"):
        os.replace(tmp, path)
    return {"path": path, "size": offset + len(data)}


def op_fs_abort(args):
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_fs_upload_tmp(_fs_path(args), args.get("upload")))
    return {}


def _fs_tar_thread(stream, fd, mode, path):
    import tarfile
    try:
        if mode == "read":
            with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w|") as t:
                t.add(path, arcname=os.path.basename(path.rstrip("/")) or ".", recursive=True)
        else:
            with os.fdopen(fd, "rb") as f, tarfile.open(fileobj=f, mode="r|") as t:
                kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                t.extractall(path, **kw)
    except BaseException as exc:  # reported by fs_stream_read/close
        stream["error"] = f"{type(exc).__name__}: {exc}"


def op_fs_tar_open(args):
    """A tar stream of `path` (mode read: pulled with fs_stream_read) or into directory `path` (mode write:
    pushed with fs_stream_write, finished by fs_stream_close)."""
    path, mode = _fs_path(args), args.get("mode")
    if mode not in ("read", "write"):
        raise RequestError("'mode' must be 'read' or 'write'")
    if mode == "read":
        os.lstat(path)  # FileNotFoundError now, not in the thread
    else:
        os.makedirs(path, exist_ok=True)
    r, w = os.pipe()
    sid = _fs_id()
    stream = {"fd": r if mode == "read" else w, "mode": mode, "error": None}
    stream["thread"] = threading.Thread(target=_fs_tar_thread, args=(stream, w if mode == "read" else r, mode, path),
                                        daemon=True)
    stream["thread"].start()
    FS_STREAMS[sid] = stream
    return {"stream": sid}


def _fs_stream(args):
    stream = FS_STREAMS.get(args.get("stream"))
    if stream is None:
        raise RequestError(f"no stream {args.get('stream')!r}")
    return stream


def op_fs_stream_read(args):
    stream = _fs_stream(args)
    length = _fs_int(args, "length", 1 << 20, 1, FS_CHUNK_MAX)
    parts, have = [], 0
    while have < length:
        b = os.read(stream["fd"], length - have)
        if not b:
            break
        parts.append(b)
        have += len(b)
    eof = have < length
    if eof:
        stream["thread"].join(5)
        if stream["error"]:
            raise RequestError(f"tar of the source failed: {stream['error']}")
    return {"data": base64.b64encode(b"".join(parts)).decode(), "eof": eof}


def op_fs_stream_write(args):
    stream = _fs_stream(args)
    data = base64.b64decode(args.get("data", ""))
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(stream["fd"], view):]
    except BrokenPipeError:
        stream["thread"].join(5)
        raise RequestError(f"extracting the tar failed: {stream['error']}") from None
    return {"size": len(data)}


def op_fs_stream_close(args):
    stream = FS_STREAMS.pop(args.get("stream"), None)
    if stream is None:
        return {"error": None}
    with contextlib.suppress(OSError):
        os.close(stream["fd"])
    stream["thread"].join(float(args.get("wait", 60)))
    return {"error": stream["error"]}


class _FsInotify:
    """A watch through inotify(7) by ctypes; directories created under a recursive watch are watched too."""

    MASK = 0x2 | 0x4 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800  # MODIFY ATTRIB MOVED_* CREATE DELETE *_SELF
    KINDS = ((0x100, "create"), (0x80, "create"), (0x200, "remove"), (0x40, "rename"), (0x2, "write"),
             (0x4, "chmod"), (0x400, "remove"), (0x800, "rename"))

    def __init__(self, root, recursive):
        import ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.root, self.recursive, self.wds = root, recursive, {}
        self._add(root)

    def _add(self, path):
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path), self.MASK)
        if wd >= 0:
            self.wds[wd] = path
        if self.recursive and path == self.root:
            for d, dirs, _ in os.walk(path):
                for n in dirs:
                    wd = self.libc.inotify_add_watch(self.fd, os.fsencode(os.path.join(d, n)), self.MASK)
                    if wd >= 0:
                        self.wds[wd] = os.path.join(d, n)

    def events(self):
        out = []
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            i = 0
            while i + 16 <= len(buf):
                wd, mask, _, n = struct.unpack_from("iIII", buf, i)
                name = buf[i + 16:i + 16 + n].rstrip(b"\0").decode("utf-8", "surrogateescape")
                i += 16 + n
                out.extend(self._decode(wd, mask, name))

    def _decode(self, wd, mask, name):
        base = self.wds.get(wd)
        if base is None:
            return []
        full = os.path.join(base, name) if name else base
        if self.recursive and mask & 0x40000100 == 0x40000100:  # IN_ISDIR | IN_CREATE
            self._add(full)
        rel = os.path.relpath(full, self.root)
        return [[kind, rel] for bit, kind in self.KINDS if mask & bit][:1]

    def close(self):
        os.close(self.fd)


class _FsPoll:
    """A watch without inotify: each poll walks the tree (at most FS_WALK_MAX entries) and diffs it."""

    def __init__(self, root, recursive):
        self.root, self.recursive = root, recursive
        self.seen = self._walk()

    def _walk(self):
        seen = {}
        for d, dirs, files in os.walk(self.root):
            for n in dirs + files:
                p = os.path.join(d, n)
                with contextlib.suppress(OSError):
                    s = os.lstat(p)
                    seen[os.path.relpath(p, self.root)] = (s.st_mtime_ns, s.st_size, s.st_mode)
                if len(seen) >= FS_WALK_MAX:
                    return seen
            if not self.recursive:
                break
        return seen

    def events(self):
        now = self._walk()
        out = [["create", p] for p in now if p not in self.seen] + [["remove", p] for p in self.seen if p not in now]
        for p, v in now.items():
            old = self.seen.get(p)
            if old is not None and old != v:
                out.append(["chmod" if old[:2] == v[:2] else "write", p])
        self.seen = now
        return out

    def close(self):
        pass


def op_fs_watch_start(args):
    path = _fs_path(args)
    if not os.path.isdir(path):
        raise NotADirectoryError(f"{path} is not a directory")
    recursive = bool(args.get("recursive"))
    try:
        w = _FsInotify(path, recursive)
    except (ImportError, OSError, AttributeError):
        w = _FsPoll(path, recursive)
    wid = _fs_id()
    FS_WATCHES[wid] = {"w": w, "queue": [], "overflow": False}
    return {"watch": wid, "kind": "inotify" if isinstance(w, _FsInotify) else "poll"}


def op_fs_watch_poll(args):
    watch = FS_WATCHES.get(args.get("watch"))
    if watch is None:
        raise RequestError(f"no watch {args.get('watch')!r}")
    q = watch["queue"]
    for ev in watch["w"].events():
        if not q or q[-1] != ev:  # a burst of writes to one file is one event
            q.append(ev)
    if len(q) > FS_QUEUE_MAX:
        del q[:len(q) - FS_QUEUE_MAX]
        watch["overflow"] = True
    limit = _fs_int(args, "limit", FS_EVENTS_MAX, 1, FS_EVENTS_MAX)
    out, watch["queue"] = q[:limit], q[limit:]
    overflow, watch["overflow"] = watch["overflow"], False
    return {"events": out, "more": bool(watch["queue"]), "overflow": overflow}


def op_fs_watch_stop(args):
    watch = FS_WATCHES.pop(args.get("watch"), None)
    if watch is not None:
        watch["w"].close()
    return {}


OPS.update({"fs_stat": op_fs_stat, "fs_list": op_fs_list, "fs_remove": op_fs_remove, "fs_rename": op_fs_rename,
            "fs_mkdir": op_fs_mkdir, "fs_chmod": op_fs_chmod, "fs_read": op_fs_read, "fs_write": op_fs_write,
            "fs_abort": op_fs_abort, "fs_tar_open": op_fs_tar_open, "fs_stream_read": op_fs_stream_read,
            "fs_stream_write": op_fs_stream_write, "fs_stream_close": op_fs_stream_close,
            "fs_watch_start": op_fs_watch_start, "fs_watch_poll": op_fs_watch_poll,
            "fs_watch_stop": op_fs_watch_stop})
# ---------------------------------------------------------------- end of files (agent-files)


def reap_orphans():
    """PID 1 adopts orphans; reap those that are not an exec we are still waiting for."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid in LIVE_PIDS:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)


# ---------------------------------------------------------------- transport


class Port:
    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR)
        fcntl.fcntl(self.fd, fcntl.F_SETOWN, os.getpid())
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) | os.O_ASYNC)
        self.buf = bytearray()  # grows in place: a large frame is not copied once per 64 KiB read

    def _fill(self, want=65536):
        chunk = os.read(self.fd, min(max(want, 65536), 4 << 20))
        if not chunk:  # no host connected: wait until one connects
            del self.buf[:]
            signal.sigtimedwait([signal.SIGIO], 5.0)
            return
        self.buf += chunk

    def read_frame(self):
        while True:
            i = self.buf.find(MAGIC)
            if i < 0:
                del self.buf[:-3]
                self._fill()
                continue
            del self.buf[:i]  # the buffer now starts at a frame's magic
            if len(self.buf) < 8:
                self._fill()
                continue
            (n,) = struct.unpack(">I", self.buf[4:8])
            if n > MAX_FRAME:
                del self.buf[:4]
                continue
            if len(self.buf) >= 8 + n:
                payload = bytes(self.buf[8:8 + n])
                del self.buf[:8 + n]
                return payload
            self._fill(8 + n - len(self.buf))  # the rest of this frame, in as few reads as the port gives

    def write_frame(self, obj):
        data = json.dumps(obj).encode()
        view = memoryview(MAGIC + struct.pack(">I", len(data)) + data)
        with WRITE_LOCK:
            while view:
                n = os.write(self.fd, view)
                view = view[n:]


def handle(port, payload, busy=False):
    rid = None
    try:
        try:
            req = json.loads(payload)
        except ValueError as exc:
            raise RequestError(f"malformed JSON: {exc}") from None
        if not isinstance(req, dict):
            raise RequestError("request must be a JSON object")
        rid = req.get("id")
        if busy:
            raise RequestError(f"the agent is serving {MAX_HANDLERS} blocking requests already; retry later")
        fn = OPS.get(req.get("op"))
        if fn is None:
            raise RequestError("unknown op {!r} (known: {})".format(req.get("op"), ", ".join(sorted(OPS))))
        args = req.get("args") or {}
        if not isinstance(args, dict):
            raise RequestError("'args' must be an object")
        reply = {"id": rid, "ok": True, "result": fn(args)}
    except RequestError as exc:
        reply = {"id": rid, "ok": False, "error": {"type": "RequestError", "message": str(exc)}}
        if isinstance(exc, CannotRun):
            reply["error"]["exit_code"] = exc.exit_code
    except Exception as exc:
        reply = {"id": rid, "ok": False, "error": {"type": type(exc).__name__, "message": str(exc),
                                                   "traceback": traceback.format_exc()}}
    port.write_frame(reply)


def handle_threaded(port, payload):
    try:
        handle(port, payload)
    finally:
        HANDLERS.release()


def main():
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGIO])
    port = Port(find_port())
    print(f"forkd-agent: ready on {PORT_NAME}", flush=True)
    while True:
        payload = port.read_frame()
        if any(t in payload for t in THREADED):  # may block: its own thread
            if HANDLERS.acquire(blocking=False):
                threading.Thread(target=handle_threaded, args=(port, payload), daemon=True).start()
            else:
                handle(port, payload, busy=True)
        else:  # inline: a fresh child answers its first requests without translating thread start-up
            handle(port, payload)


if __name__ == "__main__":
    main()
