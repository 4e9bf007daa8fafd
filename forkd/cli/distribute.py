"""`forkd snapshot push TAG REF` and `forkd snapshot pull REF@sha256:...`: snapshot chains through an OCI registry."""

from __future__ import annotations

from pathlib import Path

import typer

from forkd.cli.daemon import backend
from forkd.cli.output import Fmt, Progress, emit, size

OUTPUT = typer.Option(Fmt.table, "-o", "--output", help="table, json or yaml")
AUTHFILE = typer.Option(None, "--authfile", help="registry credentials (default: $REGISTRY_AUTH_FILE, containers' "
                        "auth.json, ~/.docker/config.json: where image pulls look)")
CERT_DIR = typer.Option(None, "--cert-dir", help="directory of the registry's CA certificates (*.crt) to trust")
INSECURE = typer.Option(False, "--insecure-registry", help="allow plain HTTP and unverified TLS (a test registry); "
                        "default: verified TLS only")


def register(snapshot_app: typer.Typer) -> None:
    snapshot_app.command("push")(push_cmd)
    snapshot_app.command("pull")(pull_cmd)


def _registry(authfile: Path | None, cert_dir: Path | None, insecure: bool):
    """How the daemon reaches the registry (paths as the daemon sees them), or None for skopeo's defaults."""
    if not (authfile or cert_dir or insecure):
        return None
    from forkd.client.wire import RegistryPull

    return RegistryPull(authfile=str(authfile.resolve()) if authfile else None,
                        cert_dir=str(cert_dir.resolve()) if cert_dir else None, tls_verify=not insecure)


def push_cmd(tag: str = typer.Argument(..., help="chain head to push (its ancestors and guest image go with it)"),
             ref: str = typer.Argument(..., help="[docker://]HOST[:PORT]/NAME:TAG to push to"),
             level: int = typer.Option(3, "--level", help="zstandard level of the pack (1-19)"),
             authfile: Path | None = AUTHFILE, cert_dir: Path | None = CERT_DIR, insecure_registry: bool = INSECURE,
             output: Fmt = OUTPUT) -> None:
    """Pack a snapshot chain and push it to an OCI registry as an artifact; prints the digest to pull it by.

    The artifact is one OCI manifest (artifactType application/vnd.forkd.snapshot.v1) whose one layer is the pack
    ('forkd pack'). Other nodes install exactly these bytes with 'forkd snapshot pull REF@DIGEST'."""
    from forkd.client.wire import SnapshotPushRequest

    req = SnapshotPushRequest(tag=tag, ref=ref, level=level, registry=_registry(authfile, cert_dir, insecure_registry))
    res = backend().snapshot_push(req, progress=Progress(output != Fmt.table))
    emit(res, output, [("TAG", "left"), ("CHAIN", "left"), ("SIZE", "right"), ("PULL BY", "left")],
         [[res["tag"], " -> ".join(res["chain"]), size(res["pack_bytes"]), res["pinned"]]])


def pull_cmd(ref: str = typer.Argument(..., help="[docker://]HOST[:PORT]/NAME@sha256:DIGEST (a :TAG is resolved "
                                       "to its digest now, and trusts the registry for it)"),
             authfile: Path | None = AUTHFILE, cert_dir: Path | None = CERT_DIR, insecure_registry: bool = INSECURE,
             output: Fmt = OUTPUT) -> None:
    """Pull a snapshot chain from an OCI registry, verify every digest and install it (atomic, idempotent).

    The manifest must hash to the digest named, the config and the pack to theirs, sizes stay within
    FORKD_PACK_MAX_BYTES, and the pack is then verified as 'forkd unpack' does; nothing is installed otherwise.
    Exit codes: 2 refused (digest mismatch, tampered or malformed artifact), 3 not found, 4 a tag with other
    content, 6 registry unreachable."""
    from forkd.client.wire import SnapshotPullRequest

    req = SnapshotPullRequest(ref=ref, registry=_registry(authfile, cert_dir, insecure_registry))
    res = backend().snapshot_pull(req, progress=Progress(output != Fmt.table))
    emit(res, output, [("HEAD", "left"), ("CHAIN", "left"), ("DIGEST", "left"), ("INSTALLED", "left"),
                       ("ALREADY THERE", "left"), ("SECONDS", "right")],
         [[res["head"], " -> ".join(res["chain"]), res["digest"], ", ".join(res["installed"]) or "-",
           ", ".join(res["skipped"]) or "-", f"{res['seconds']:.1f}"]])
