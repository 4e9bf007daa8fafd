"""The guest agent's files block (helper agent-files; its host side is forkd/vmm/agent_files.py): list, stat,
remove, rename, mkdir, chmod; reads and writes by offset in bounded chunks (any size streams as many
request/response pairs); tar streams (a thread writes/reads a pipe, the host pulls/pushes bounded chunks); and
watches of a directory: inotify through ctypes when the guest's Python has it, else a polling diff of a walk.
Every op is one request and one reply, independent of the transport."""

import base64
import contextlib
import os
import struct
import threading

from agent_base import RequestError

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
    """One page of a directory: entries [name, type, size, mode, mtime] with names after `after`, sorted. Entries
    are looked at relative to the directory, so a name that makes a path past PATH_MAX is still listed."""
    path = _fs_path(args)
    after = args.get("after") or ""
    if not isinstance(after, str):
        raise RequestError("'after' must be a name")
    limit = _fs_int(args, "limit", FS_LIST_MAX, 1, FS_LIST_MAX)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        names = sorted(n for n in os.listdir(fd) if n > after)
        out = []
        for n in names[:limit]:
            try:
                s = os.lstat(n, dir_fd=fd)
            except FileNotFoundError:
                continue
            out.append([n, _fs_type(s.st_mode), s.st_size, s.st_mode & 0o7777, s.st_mtime])
    finally:
        os.close(fd)
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
