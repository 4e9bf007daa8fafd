"""The guest agent's core ops: ping, exec (one command, its output whole), eval / exec_code (Python in the
agent's own warm interpreter), read_file / write_file (one request each), fsfreeze (the root filesystem frozen
for a copy of a disk-backed guest) and forked (a fresh child's new entropy, identity and clock)."""

import base64
import builtins
import contextlib
import fcntl
import io
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback

from agent_base import LIVE_PIDS, RequestError, reap_orphans

DEFAULT_OUTPUT_CAP = 1 << 20
RNDADDENTROPY = 0x40085203
RNDRESEEDCRNG = 0x5207
FIFREEZE = 0xC0045877
FITHAW = 0xC0045878

NS = {"__name__": "__forkd__", "__builtins__": builtins}
STATE = {"child_id": None, "boot": time.monotonic(), "thaw_timer": None}
EVAL_LOCK = threading.Lock()
FREEZE_LOCK = threading.Lock()


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


def op_clock(args):
    """Set the guest's wall clock to the host's (`time`, seconds since the epoch): after a sleep (forkd.sandbox.
    sleep) the guest's clock stood still while its vCPUs were stopped."""
    try:
        now = float(args.get("time"))
    except (TypeError, ValueError):
        raise RequestError("clock: 'time' must be a number of seconds since the epoch") from None
    time.clock_settime(time.CLOCK_REALTIME, now)
    return {"time": time.time()}


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
