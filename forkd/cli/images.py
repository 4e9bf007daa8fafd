"""`forkd from-image REF --tag T` (guest images from OCI layouts, docker save tarballs, registries) and the Debian
options of `forkd image build`. Parsing and printing only: the work is the backend's (forkd.client)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from forkd.cli.daemon import backend
from forkd.cli.output import Fmt, Progress, emit, ms, size

OUTPUT = typer.Option(Fmt.table, "-o", "--output", help="table, json or yaml")
ROOTFS_HELP = ("initramfs: the rootfs lives in guest RAM; disk: an ext4 root disk, each child writing its own "
               "copy-on-write overlay (for big images); auto: disk above 1 GiB")


class RootfsKind(StrEnum):
    auto = "auto"
    initramfs = "initramfs"
    disk = "disk"


image_app = typer.Typer(help="Guest images (kernel + initramfs with Python and the forkd agent).",
                        no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.command("from-image")(from_image_cmd)
    app.add_typer(image_app, name="image")


@image_app.command("build")
def image_build(force: bool = typer.Option(False, help="rebuild even if the cached image is current"),
                debian_packages: list[str] = typer.Option([], "--debian-packages", help="instead of the default "
                                                          "image: a Debian rootfs with python3 + these packages "
                                                          "(mmdebstrap; repeat or comma-separate)"),
                preset: str | None = typer.Option(None, "--preset", help="a Debian image with a named package set "
                                                  "(plus any --debian-packages): full = bash, git, curl, "
                                                  "ca-certificates, python3-pip, python3-venv (commands then run "
                                                  "under bash -l -c); full-build = full + build-essential"),
                suite: str = typer.Option("bookworm", "--suite", help="Debian suite for --debian-packages"),
                rootfs: RootfsKind = typer.Option(RootfsKind.auto, "--rootfs",
                                                  help="with --debian-packages: " + ROOTFS_HELP),
                output: Fmt = OUTPUT) -> None:
    """Build the default guest image from Debian packages (cached by content; rebuilt only on change)."""
    if debian_packages or preset:
        return debian_build(debian_packages, suite, force, output, rootfs.value, preset)
    data = backend().build_image(force=force, progress=Progress(quiet=output != Fmt.table))
    emit(data, output, [("IMAGE", "left"), ("STATE", "left"), ("INITRD", "right"), ("PATH", "left")],
         [[data["id"], "built" if data["built_now"] else "cached", size(data.get("initrd_bytes")), data["path"]]])


def from_image_cmd(
        ref: str = typer.Argument(..., help="an OCI image layout directory, a 'docker save' tarball, or "
                                  "docker://HOST/NAME[:TAG][@sha256:DIGEST] (pulled with skopeo, pinned to its "
                                  "digest)"),
        tag: str = typer.Option(..., "--tag", "-t", help="snapshot name (lowercase letters, digits, . _ -)"),
        apt: list[str] = typer.Option([], "--apt", help="NOT supported for OCI images (use the Debian path)"),
        pip: list[str] = typer.Option([], "--pip", help="wheel to install into the rootfs (resolved on the host "
                                      "for the guest's Python; repeat)"),
        memory_mib: int = typer.Option(512, "--memory-mib", help="guest RAM in MiB (holds the whole rootfs unless "
                                       "it is disk-backed)"),
        rootfs: RootfsKind = typer.Option(RootfsKind.auto, "--rootfs", help=ROOTFS_HELP),
        vcpus: int = typer.Option(1, "--vcpus"),
        warm_import: list[str] = typer.Option([], "--warm-import", help="module to import in the agent (repeat)"),
        warm_run: list[str] = typer.Option([], "--warm-run", help="shell command to run before pausing (repeat)"),
        authfile: Path | None = typer.Option(None, "--authfile", help="docker://: registry credentials (default: "
                                             "$REGISTRY_AUTH_FILE, containers' auth.json, ~/.docker/config.json)"),
        cert_dir: Path | None = typer.Option(None, "--cert-dir", help="docker://: directory of the registry's CA "
                                             "certificates (*.crt) to trust"),
        insecure_registry: bool = typer.Option(False, "--insecure-registry", help="docker://: allow plain HTTP "
                                               "and unverified TLS (a test registry); default: verified TLS only"),
        output: Fmt = OUTPUT) -> None:
    """Build a guest image from a container image (no Docker engine), then boot, warm and snapshot it."""
    ref = str(Path(ref).resolve()) if Path(ref).exists() else ref  # a daemon reads it from its own cwd
    from forkd.client.wire import FromImageRequest, RegistryPull

    registry = None
    if authfile or cert_dir or insecure_registry:  # paths as the daemon sees them
        registry = RegistryPull(authfile=str(authfile.resolve()) if authfile else None,
                                cert_dir=str(cert_dir.resolve()) if cert_dir else None,
                                tls_verify=not insecure_registry)
    req = FromImageRequest(ref=ref, tag=tag, memory_mib=memory_mib, vcpus=vcpus, warm_imports=warm_import,
                           warm_run=warm_run, pip=pip, apt=apt, rootfs=rootfs.value, registry=registry)
    data = backend().from_image(req, progress=Progress(output != Fmt.table))
    t, image = data["timings_ms"], data["image"]
    emit(data, output, [("TAG", "left"), ("IMAGE", "left"), ("STATE", "left"), ("ROOTFS", "right"),
                        ("AS", "left"), ("BOOT ms", "right"), ("WARM ms", "right")],
         [[data["tag"], image["id"], "built" if image["built_now"] else "cached", size(image.get("rootfs_bytes")),
           image.get("rootfs", "initramfs"), ms(t.get("boot")), ms(t.get("warmup"))]])


def debian_build(packages: list[str], suite: str | None, force: bool, output: Fmt, rootfs: str = "auto",
                 preset: str | None = None) -> None:
    """`forkd image build --debian-packages ... | --preset NAME`: a Debian rootfs image (cached by content)."""
    from forkd.client.wire import DebianBuildRequest
    from forkd.spec.models import preset_packages

    try:
        pkgs = preset_packages(preset, [p.strip() for item in packages for p in item.split(",") if p.strip()])
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--preset") from None
    req = DebianBuildRequest(packages=pkgs, suite=suite, force=force, rootfs=rootfs)
    data = backend().build_debian(req, progress=Progress(output != Fmt.table))
    emit(data, output, [("IMAGE", "left"), ("STATE", "left"), ("ROOTFS", "right"), ("AS", "left"),
                        ("INITRD", "right"), ("MIN MiB", "right"), ("PATH", "left")],
         [[data["id"], "built" if data["built_now"] else "cached", size(data.get("rootfs_bytes")),
           data.get("rootfs", "initramfs"), size(data.get("initrd_bytes")), str(data.get("min_memory_mib")),
           data["path"]]])
