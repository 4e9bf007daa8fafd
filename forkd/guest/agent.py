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

This file holds the transport, the op table and main; the ops sit beside it in the guest's /forkd (sys.path[0],
so they are imported flatly; none imports the host package ``forkd``): agent_ops.py (ping, exec, eval, whole
files, fsfreeze, forked), agent_procs.py (the ``proc_*`` ops: processes that outlive a request), agent_fs.py (the
``fs_*`` ops), agent_tcp.py (the ``tcp_*`` ops: the host's relay to a guest TCP port) and agent_base.py (what
several of them share). The list is forkd.guest.AGENT_MODULES.

When no host is connected, read() on the port returns EOF at once; the agent then blocks in
sigtimedwait(SIGIO) (the port is O_ASYNC), which the kernel raises when the host connects.
"""

import fcntl
import json
import os
import signal
import struct
import threading
import time
import traceback

from agent_base import CannotRun, RequestError
from agent_fs import (
    op_fs_abort,
    op_fs_chmod,
    op_fs_list,
    op_fs_mkdir,
    op_fs_read,
    op_fs_remove,
    op_fs_rename,
    op_fs_stat,
    op_fs_stream_close,
    op_fs_stream_read,
    op_fs_stream_write,
    op_fs_tar_open,
    op_fs_watch_poll,
    op_fs_watch_start,
    op_fs_watch_stop,
    op_fs_write,
)
from agent_ops import (
    op_clock,
    op_eval,
    op_exec,
    op_exec_code,
    op_forked,
    op_fsfreeze,
    op_ping,
    op_read_file,
    op_write_file,
)
from agent_procs import (
    op_proc_kill,
    op_proc_list,
    op_proc_read,
    op_proc_resize,
    op_proc_signal,
    op_proc_start,
    op_proc_wait,
    op_proc_write,
)
from agent_tcp import op_tcp_close, op_tcp_open, op_tcp_read, op_tcp_write

PORT_NAME = "forkd.agent"
MAGIC = b"FKD1"
MAX_FRAME = 64 << 20
MAX_HANDLERS = 256  # requests served on their own thread at once

WRITE_LOCK = threading.Lock()
HANDLERS = threading.BoundedSemaphore(MAX_HANDLERS)


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


# ---------------------------------------------------------------- the op table

OPS = {"ping": op_ping, "exec": op_exec, "eval": op_eval, "exec_code": op_exec_code,
       "write_file": op_write_file, "read_file": op_read_file, "forked": op_forked, "fsfreeze": op_fsfreeze,
       "clock": op_clock,
       "proc_start": op_proc_start, "proc_read": op_proc_read, "proc_write": op_proc_write,
       "proc_resize": op_proc_resize, "proc_signal": op_proc_signal, "proc_kill": op_proc_kill,
       "proc_wait": op_proc_wait, "proc_list": op_proc_list,
       "fs_stat": op_fs_stat, "fs_list": op_fs_list, "fs_remove": op_fs_remove, "fs_rename": op_fs_rename,
       "fs_mkdir": op_fs_mkdir, "fs_chmod": op_fs_chmod, "fs_read": op_fs_read, "fs_write": op_fs_write,
       "fs_abort": op_fs_abort, "fs_tar_open": op_fs_tar_open, "fs_stream_read": op_fs_stream_read,
       "fs_stream_write": op_fs_stream_write, "fs_stream_close": op_fs_stream_close,
       "fs_watch_start": op_fs_watch_start, "fs_watch_poll": op_fs_watch_poll, "fs_watch_stop": op_fs_watch_stop,
       "tcp_open": op_tcp_open, "tcp_read": op_tcp_read, "tcp_write": op_tcp_write, "tcp_close": op_tcp_close}
# ops that may block: served on their own thread (at most MAX_HANDLERS at once), the others inline
THREADED = (b'"op": "exec"', b'"op": "proc_read"', b'"op": "proc_wait"', b'"op": "proc_write"',
            b'"op": "fs_read"', b'"op": "fs_write"', b'"op": "fs_stream_', b'"op": "fs_tar_open"',
            b'"op": "tcp_open"', b'"op": "tcp_read"', b'"op": "tcp_write"')


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
