"""The hub: packs by `owner/name` and version, listed in a `registry.json` index at a base URL.

    $FORKD_HUB = http://host:port/path   or   file:///some/dir
    <base>/registry.json = {"packs": {"owner/name": {"versions": {"1.0": {"file": "owner/name/1.0.tar.zst",
                                                                           "sha256": "...", "size": 123}},
                                                      "latest": "1.0"}}}

`pull` downloads into a temp file under $FORKD_HOME/tmp, checks size and sha256 against the index, then unpacks
(which verifies every member again); the temp file is removed whatever happens, so an interrupted pull leaves
nothing. `push` writes to file:// hubs only (pack, then the index, each by temp file + rename). `serve` is a
small static HTTP server for tests and air-gapped sites.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forkd.base.atomic import rename_into_place, write_json
from forkd.base.errors import Conflict, ForkdError, InvalidInput, NotFound
from forkd.base.locks import file_lock
from forkd.base.outside import noted_temporary
from forkd.base.owners import owned_name
from forkd.base.settings import settings
from forkd.core.pack import PackError, pack, safe_relpath, unpack

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime

INDEX = "registry.json"
_PART_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_VERSION_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 1 << 20
MAX_INDEX_BYTES = 16 << 20
TIMEOUT = 30.0

Progress = Callable[[str], None]
Bytes = Callable[[int, int], None]  # (done, total)


def _quiet(*_: Any) -> None:
    pass


class HubError(ForkdError):
    pass


@dataclass(frozen=True)
class Ref:
    name: str  # owner/name
    version: str | None

    def __str__(self) -> str:
        return self.name + (f"@{self.version}" if self.version else "")


def parse_ref(ref: str, need_version: bool = False) -> Ref:
    """`owner/name[@version]`, each part validated (paths are never built from unvalidated input)."""
    name, _, version = ref.partition("@") if isinstance(ref, str) else ("", "", "")
    parts = name.split("/")
    if len(parts) != 2 or not all(_PART_RE.match(p) and p not in (".", "..") for p in parts):
        raise InvalidInput(f"invalid pack name {ref!r}",
                           hint="use owner/name[@version]; owner and name: [a-z0-9][a-z0-9._-]{0,62}")
    if "@" in ref and (not _VERSION_RE.match(version) or version in (".", "..")):
        raise InvalidInput(f"invalid version {version!r} in {ref!r}", hint="versions use [A-Za-z0-9._-]+")
    if need_version and not version:
        raise InvalidInput(f"{ref!r} needs a version", hint="use owner/name@version, e.g. acme/py@1.0")
    return Ref(name, version or None)


def hub_url(url: str | None = None) -> str:
    url = url or settings().hub
    if not url:
        raise InvalidInput("no hub configured", hint="set FORKD_HUB=http://host:port/ or file:///path/to/hub")
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https", "file"):
        raise InvalidInput(f"hub URL {url!r}: use http://, https:// or file://")
    return url.rstrip("/") + "/"


def _file_root(url: str) -> Path:
    parts = urllib.parse.urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise InvalidInput(f"hub URL {url!r}: file:// URLs must be local (file:///path)")
    return Path(urllib.parse.unquote(parts.path))


def _open(url: str, rel: str):
    """A binary stream of `rel` under the hub, and its length if known."""
    rel = str(safe_relpath(rel, "hub file"))
    if url.startswith("file:"):
        p = _file_root(url) / rel
        try:
            f = open(p, "rb")
        except FileNotFoundError:
            raise NotFound(f"{rel} is not on the hub at {url}") from None
        return f, os.fstat(f.fileno()).st_size
    full = urllib.parse.urljoin(url, urllib.parse.quote(rel))
    try:
        resp = urllib.request.urlopen(full, timeout=TIMEOUT)  # noqa: S310 - scheme checked in hub_url
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise NotFound(f"{rel} is not on the hub at {url} (HTTP 404)") from None
        raise HubError(f"hub {url}: GET {rel} failed: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise HubError(f"hub {url} is unreachable: {getattr(exc, 'reason', exc)}",
                       hint="check FORKD_HUB and that the hub is serving") from None
    length = resp.headers.get("Content-Length")
    return resp, int(length) if length and length.isdigit() else None


def _check_index(idx: Any, url: str) -> dict:
    if not isinstance(idx, dict) or not isinstance(idx.get("packs", {}), dict):
        raise HubError(f"hub {url}: {INDEX} is not a forkd hub index")
    idx.setdefault("packs", {})
    return idx


def fetch_index(url: str | None = None) -> dict:
    url = hub_url(url)
    f, _ = _open(url, INDEX)
    with f:
        raw = f.read(MAX_INDEX_BYTES + 1)
    if len(raw) > MAX_INDEX_BYTES:
        raise HubError(f"hub {url}: {INDEX} is larger than {MAX_INDEX_BYTES} bytes")
    try:
        return _check_index(json.loads(raw), url)
    except ValueError as exc:
        raise HubError(f"hub {url}: {INDEX} is not valid JSON ({exc})") from None


def resolve(idx: dict, ref: Ref, url: str) -> tuple[str, dict]:
    """(version, entry) of `ref` in the index, validated."""
    pk = idx["packs"].get(ref.name)
    if not isinstance(pk, dict) or not isinstance(pk.get("versions"), dict):
        raise NotFound(f"no pack {ref.name!r} on the hub at {url}")
    version = ref.version or pk.get("latest")
    if not isinstance(version, str) or not _VERSION_RE.match(version):
        raise NotFound(f"pack {ref.name!r} has no usable 'latest' version on the hub; name one with @VERSION")
    entry = pk["versions"].get(version)
    if not isinstance(entry, dict):
        have = ", ".join(sorted(pk["versions"])) or "none"
        raise NotFound(f"pack {ref.name!r} has no version {version!r} on the hub at {url}",
                       hint=f"versions: {have}")
    file, sha, size = entry.get("file"), entry.get("sha256"), entry.get("size")
    safe_relpath(file, "hub index file")
    if not isinstance(sha, str) or not _SHA_RE.match(sha) or not isinstance(size, int) or size < 0:
        raise HubError(f"hub index entry for {ref.name}@{version} lacks a valid sha256 and size")
    return version, entry


def pull(rt: Runtime, ref_s: str, url: str | None = None, progress: Progress = _quiet,
         on_bytes: Bytes = _quiet) -> dict:
    """Download `owner/name[@version]`, verify it against the index, and unpack it."""
    t0 = time.perf_counter()
    ref = parse_ref(ref_s)
    url = hub_url(url)
    idx = fetch_index(url)
    version, entry = resolve(idx, ref, url)
    size, want = entry["size"], entry["sha256"]
    tmp = rt.layout.tmp / owned_name("pull", ".tar.zst")
    try:
        progress(f"downloading {ref.name}@{version} ({size} bytes) from {url}")
        src, _length = _open(url, entry["file"])
        h, n = hashlib.sha256(), 0
        with src, open(tmp, "xb") as out:
            while n <= size:
                try:
                    b = src.read(min(CHUNK, size + 1 - n))
                except OSError as exc:
                    raise HubError(f"download of {ref.name}@{version} was interrupted: {exc}") from None
                if not b:
                    break
                out.write(b)
                h.update(b)
                n += len(b)
                on_bytes(n, size)
            out.flush()
            os.fsync(out.fileno())
        if n != size:
            raise PackError(f"download of {ref.name}@{version}: got {n if n <= size else 'more than ' + str(size)} "
                            f"bytes, the index says {size}: refused")
        if h.hexdigest() != want:
            raise PackError(f"download of {ref.name}@{version} does not match the sha256 in the hub index "
                            f"({h.hexdigest()[:12]} != {want[:12]}): refused")
        dl_s = time.perf_counter() - t0
        res = unpack(rt, tmp, progress)
    finally:
        tmp.unlink(missing_ok=True)
    return dict(res, name=ref.name, version=version, hub=url, bytes=size, download_seconds=round(dl_s, 3),
                seconds=round(time.perf_counter() - t0, 3))


def _locked(root: Path):
    return file_lock(root / ".registry.lock", 0o644)


def push(rt: Runtime, tag: str, ref_s: str, url: str | None = None, progress: Progress = _quiet,
         force: bool = False) -> dict:
    """Pack `tag` as owner/name@version into a file:// hub and list it in the index."""
    ref = parse_ref(ref_s, need_version=True)
    url = hub_url(url)
    if not url.startswith("file:"):
        raise InvalidInput(f"push to {url} is not supported: only file:// hubs can be pushed to",
                           hint="push to a local directory (FORKD_HUB=file:///dir) and serve or sync it")
    root = _file_root(url)
    root.mkdir(parents=True, exist_ok=True)
    owner, name = ref.name.split("/")
    rel = f"{owner}/{name}/{ref.version}.tar.zst"
    dest = root / owner / name / f"{ref.version}.tar.zst"
    with _locked(root):
        idx = _read_local_index(root, url)
        existing = idx["packs"].get(ref.name, {}).get("versions", {}).get(ref.version)
        if existing and not force:
            raise Conflict(f"{ref} is already on the hub", hint="push a new version, or pass --force to replace it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with noted_temporary(dest, rt.layout.tmp) as tmp:  # a pusher killed mid-way: gc finds it (forkd.base.outside)
        res = pack(rt, tag, tmp, progress)
        size = tmp.stat().st_size
        h = hashlib.sha256()
        with open(tmp, "rb") as f:
            while b := f.read(CHUNK):
                h.update(b)
        with _locked(root):
            idx = _read_local_index(root, url)
            if idx["packs"].get(ref.name, {}).get("versions", {}).get(ref.version) and not force:
                raise Conflict(f"{ref} was pushed by someone else meanwhile")
            rename_into_place(tmp, dest)
            pk = idx["packs"].setdefault(ref.name, {"versions": {}})
            pk.setdefault("versions", {})[ref.version] = {"file": rel, "sha256": h.hexdigest(), "size": size,
                                                          "head": tag, "chain": res["chain"],
                                                          "pushed_at": time.time()}
            pk["latest"] = ref.version
            write_json(root / INDEX, idx)
    return dict(res, name=ref.name, version=ref.version, hub=url, file=rel, sha256=h.hexdigest(), bytes=size)


def _read_local_index(root: Path, url: str) -> dict:
    try:
        return _check_index(json.loads((root / INDEX).read_text()), url)
    except FileNotFoundError:
        return {"packs": {}}
    except ValueError as exc:
        raise HubError(f"hub {url}: {INDEX} is not valid JSON ({exc})") from None


# -- serving ---------------------------------------------------------------------------------------------
class _Handler(http.server.SimpleHTTPRequestHandler):
    """Static files only: no directory listings, no writes."""

    def list_directory(self, path):  # noqa: ARG002 - signature of the base class
        self.send_error(404, "not found")
        return None

    def log_message(self, fmt: str, *args: Any) -> None:
        if self.server.log:  # type: ignore[attr-defined]
            super().log_message(fmt, *args)


def make_server(directory: Path, port: int = 8080, bind: str = "127.0.0.1",
                log: bool = True) -> http.server.ThreadingHTTPServer:
    directory = Path(directory).resolve()
    if not directory.is_dir():
        raise InvalidInput(f"{directory} is not a directory")

    def handler(*a: Any, **kw: Any) -> _Handler:
        return _Handler(*a, directory=str(directory), **kw)

    try:
        srv = http.server.ThreadingHTTPServer((bind, port), handler)
    except OSError as exc:
        raise ForkdError(f"cannot listen on {bind}:{port}: {exc.strerror or exc}") from None
    srv.daemon_threads = True
    srv.log = log  # type: ignore[attr-defined]
    return srv


def serve_in_thread(directory: Path, port: int = 0, bind: str = "127.0.0.1"):
    """Start a hub server in a daemon thread; returns (server, base URL). Stop with server.shutdown()."""
    srv = make_server(directory, port, bind, log=False)
    threading.Thread(target=srv.serve_forever, name="forkd-hub", daemon=True).start()
    host, p = srv.server_address[:2]
    return srv, f"http://{host}:{p}/"

