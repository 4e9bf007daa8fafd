"""Container images from a registry (`docker://REF`), pulled with skopeo and pinned by digest.

    resolve(ref, options) -> Pinned    the manifest the reference names now (`skopeo inspect --raw`), hashed here:
                                       a list/index is narrowed to its linux/amd64 manifest; a `@sha256:` pin in the
                                       reference must match the bytes the registry sent
    pull(pinned, dest) -> Source       `skopeo copy docker://REPO@DIGEST dir:DEST`, then the copied manifest is
                                       hashed again and must be the pinned one; layers and config are verified
                                       against their digests as they are read (forkd.image.oci)

The `dir:` transport keeps the registry's manifest byte for byte (an `oci:` copy may rewrite a Docker manifest into
an OCI one, with another digest), so what is unpacked is provably what the digest names. Credentials come from
where skopeo looks for them ($REGISTRY_AUTH_FILE, ${XDG_RUNTIME_DIR}/containers/auth.json,
~/.config/containers/auth.json, ~/.docker/config.json) or an explicit authfile; nothing here reads them.
TLS is verified by default; plain HTTP (or an unverified certificate) needs `tls_verify=False`, said aloud.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from forkd.base.errors import ForkdError, InvalidInput, NotFound, Unavailable
from forkd.image.oci import INDEX_TYPES, MANIFEST_TYPES, Source, manifest_source, pick_manifest, sha256_blob_path

PREFIX = "docker://"
SKOPEO = "skopeo"
MAX_MANIFEST_BYTES = 4 << 20
MAX_REF_CHARS = 512
TIMEOUT_S = 1800.0
SCHEMA1 = "application/vnd.docker.distribution.manifest.v1"
MANIFEST_OCI = "application/vnd.oci.image.manifest.v1+json"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]{1,5})?)"
_PATH = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def is_registry_ref(ref: object) -> bool:
    return isinstance(ref, str) and ref.startswith(PREFIX)


@dataclass(frozen=True)
class RegistryOptions:
    """How to reach the registry: an authfile (else skopeo's usual places), a directory of CA certificates
    (`*.crt`) and client keys for it (else the system's, /etc/containers/certs.d/HOST), and whether TLS is
    verified (False also allows plain HTTP)."""

    authfile: str | None = None
    cert_dir: str | None = None
    tls_verify: bool = True

    def __post_init__(self) -> None:
        if self.authfile is not None and not Path(self.authfile).is_file():
            raise NotFound(f"--authfile {self.authfile}: no such file",
                           hint="write one with `skopeo login --authfile FILE REGISTRY` (or pass none: skopeo then "
                                "reads $REGISTRY_AUTH_FILE, containers' auth.json or ~/.docker/config.json)")
        if self.cert_dir is not None and not Path(self.cert_dir).is_dir():
            raise NotFound(f"--cert-dir {self.cert_dir}: no such directory",
                           hint="a directory holding the registry's CA certificate as *.crt")

    def flags(self, prefix: str = "") -> list[str]:
        """skopeo's flags for these options (`prefix` "src-" for copy)."""
        out = [f"--{prefix}tls-verify={'true' if self.tls_verify else 'false'}"]
        if self.authfile:
            out.append(f"--{prefix}authfile={self.authfile}")
        if self.cert_dir:
            out.append(f"--{prefix}cert-dir={self.cert_dir}")
        return out


@dataclass(frozen=True)
class Reference:
    host: str             # the registry, as skopeo reaches it (docker.io when the reference names none)
    repository: str       # host/path, without tag or digest
    tag: str | None
    digest: str | None    # a pin given in the reference

    @property
    def text(self) -> str:
        return PREFIX + self.repository + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest
                                                                                    else "")


def parse(ref: str) -> Reference:
    """`docker://[HOST[:PORT]/]PATH[:TAG][@sha256:HEX]`, checked before anything runs."""
    if not is_registry_ref(ref) or len(ref) > MAX_REF_CHARS:
        raise InvalidInput(f"image reference {ref[:80]!r} is not docker://[HOST/]NAME[:TAG][@sha256:DIGEST] "
                           f"(at most {MAX_REF_CHARS} characters)")
    name, _, digest = ref[len(PREFIX):].partition("@")
    first, _, rest = name.partition("/")
    host = first if rest and ("." in first or ":" in first or first == "localhost") else None
    path = rest if host else name
    path, _, tag = path.partition(":")
    if (host is not None and not re.fullmatch(_HOST, host)) or not _PATH.match(path) \
            or (tag and not _TAG.match(tag)) or (digest and not _DIGEST.match(digest)) or name.endswith(":"):
        raise InvalidInput(f"image reference {ref!r} is malformed",
                           hint="docker://HOST[:PORT]/NAME[:TAG] or docker://HOST/NAME@sha256:DIGEST (names are "
                                "lowercase; only sha256 digests)")
    return Reference(host or "docker.io", f"{host}/{path}" if host else path, tag or None, digest or None)


@dataclass(frozen=True)
class Pinned:
    ref: Reference
    options: RegistryOptions
    digest: str           # what the reference resolved to (an index's digest when it names one)
    manifest: str         # the linux/amd64 image manifest's digest: what is pulled and unpacked
    layer_bytes: int      # the compressed layer sizes the manifest declares

    def record(self) -> dict:
        return {"kind": "registry", "ref": self.ref.text, "repository": self.ref.repository, "digest": self.digest,
                "manifest": self.manifest}


def skopeo(args: list[str], what: str, ref: Reference) -> bytes:
    """Run skopeo with `args`; its output, or its failure as the error kind a caller can act on (naming `what` and
    `ref`)."""
    argv = [SKOPEO, *args]
    try:
        res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise Unavailable(f"{what} {ref.text}: skopeo is not installed",
                          hint="apt-get install skopeo (scripts/setup.sh installs it)") from None
    except subprocess.TimeoutExpired:
        raise Unavailable(f"{what} {ref.text}: skopeo did not finish in {TIMEOUT_S:g} s") from None
    if res.returncode == 0:
        return res.stdout
    msg = res.stderr.decode(errors="replace").strip()[-600:] or f"exit {res.returncode}"
    raise _error(what, ref, msg)


def _error(what: str, ref: Reference, msg: str) -> ForkdError:
    """skopeo's failure as the error kind a caller can act on, with what to do."""
    low = msg.lower()
    head = f"{what} {ref.text} failed: {msg}"
    if "http response to https client" in low:
        return InvalidInput(head, hint=f"{ref.host} speaks plain HTTP: forkd pulls over verified TLS only, unless "
                                       "told otherwise (--insecure-registry; for a spec, list the registry in "
                                       "FORKD_INSECURE_REGISTRIES)")
    if "x509" in low or "certificate" in low:
        return InvalidInput(head, hint=f"trust {ref.host}'s CA: --cert-dir DIR holding it as *.crt (or "
                                       f"/etc/containers/certs.d/{ref.host}/ca.crt)")
    if "unauthorized" in low or "authentication required" in low or "denied" in low:
        return InvalidInput(head, hint=f"log in: skopeo login {ref.host} (or --authfile FILE; forkd uses "
                                       "$REGISTRY_AUTH_FILE, containers' auth.json or ~/.docker/config.json)")
    if "manifest unknown" in low or "not found" in low or "name unknown" in low:
        return NotFound(head, hint="check the name, tag or digest (skopeo list-tags docker://REPO lists tags)")
    return Unavailable(head, hint="is the registry reachable from this host?")


def _manifest(ref: Reference, at: str, options: RegistryOptions) -> tuple[bytes, dict]:
    raw = skopeo(["inspect", "--raw", "--no-tags", *options.flags(), PREFIX + at], "reading the manifest of", ref)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise InvalidInput(f"{ref.text}: the registry sent a manifest of {len(raw)} bytes (at most "
                           f"{MAX_MANIFEST_BYTES})")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise InvalidInput(f"{ref.text}: the registry's manifest is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("schemaVersion") != 2 or SCHEMA1 in str(doc.get("mediaType", "")):
        raise InvalidInput(f"{ref.text}: only schema 2 manifests (Docker v2.2 or OCI) are supported",
                           hint="re-push the image with a current tool (skopeo copy, docker push)")
    return raw, doc


def resolve(ref: str, options: RegistryOptions | None = None) -> Pinned:
    """Pin `ref` to the digest of the linux/amd64 image manifest the registry serves for it now."""
    r, options = parse(ref), options or RegistryOptions()
    at = r.repository + (f":{r.tag}" if r.tag else "") + (f"@{r.digest}" if r.digest else "")
    raw, doc = _manifest(r, at, options)
    top = "sha256:" + hashlib.sha256(raw).hexdigest()
    if r.digest and top != r.digest:
        raise InvalidInput(f"{r.text}: the registry answered with a manifest whose digest is {top}, not the pinned "
                           f"{r.digest}; refused")
    digest = top
    if doc.get("mediaType") in INDEX_TYPES or ("manifests" in doc and "layers" not in doc):
        entry = pick_manifest(doc.get("manifests") or [], f"{r.text} (index {top})")
        digest = str(entry.get("digest", ""))
        raw, doc = _manifest(r, f"{r.repository}@{digest}", options)
        if "sha256:" + hashlib.sha256(raw).hexdigest() != digest:
            raise InvalidInput(f"{r.text}: the manifest the registry sent for {digest} hashes to something else; "
                               "refused")
    sizes = [x.get("size", 0) for x in doc.get("layers") or [] if isinstance(x, dict)]
    total = sum(s for s in sizes if isinstance(s, int) and s > 0)
    return Pinned(r, options, top, digest, total)


def pull(pinned: Pinned, dest: Path) -> Source:
    """Copy the pinned manifest and its blobs into `dest` (a new directory) and open them as a Source."""
    free = shutil.disk_usage(dest.parent).free
    if pinned.layer_bytes * 2 > free:
        raise Unavailable(f"pulling {pinned.ref.text}: its layers take {pinned.layer_bytes} bytes compressed and "
                          f"only {free} bytes are free under {dest.parent}", hint="free some space, or forkd gc")
    skopeo(["copy", "--quiet", *pinned.options.flags("src-"), f"{PREFIX}{pinned.ref.repository}@{pinned.manifest}",
             f"dir:{dest}"], "pulling", pinned.ref)
    return dir_source(dest, pinned.manifest, pinned.ref.text)


def dir_source(root: Path, digest: str, ref: str) -> Source:
    """A skopeo `dir:` copy (manifest.json + blobs named by their hex digest) whose manifest must hash to
    `digest`."""
    path = root / "manifest.json"
    raw = path.read_bytes() if path.is_file() and path.stat().st_size <= MAX_MANIFEST_BYTES else b""
    got = "sha256:" + hashlib.sha256(raw).hexdigest()
    if got != digest:
        raise InvalidInput(f"{ref}: the pulled manifest ({path}) hashes to {got}, not the pinned {digest}; refused")
    doc = json.loads(raw)
    if doc.get("mediaType", MANIFEST_OCI) not in MANIFEST_TYPES:
        raise InvalidInput(f"{ref}: the pulled manifest has media type {doc.get('mediaType')!r}, not an image "
                           "manifest; refused")
    return manifest_source("registry", ref, digest, doc,
                           lambda d, what: sha256_blob_path(root, root / d.partition(":")[2], d, what))
