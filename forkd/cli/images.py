"""`forkd from-image REF --tag T` (guest images from OCI layouts / docker save tarballs) and the Debian options
of `forkd image build` (issue 9). Parsing and printing only: the work is in forkd.core.images."""

from __future__ import annotations

from enum import StrEnum

import typer

from forkd.cli.output import Fmt, Progress, emit, ms, size

OUTPUT = typer.Option(Fmt.table, "-o", "--output", help="table, json or yaml")
ROOTFS_HELP = ("initramfs: the rootfs lives in guest RAM; disk: an ext4 root disk, each child writing its own "
               "copy-on-write overlay (for big images); auto: disk above 1 GiB")


class RootfsKind(StrEnum):
    auto = "auto"
    initramfs = "initramfs"
    disk = "disk"


def register(app: typer.Typer) -> None:
    app.command("from-image")(from_image_cmd)


def _rt():
    from forkd.core.runtime import Runtime

    return Runtime()


def from_image_cmd(
        ref: str = typer.Argument(..., help="an OCI image layout directory or a 'docker save' tarball"),
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
        output: Fmt = OUTPUT) -> None:
    """Build a guest image from a container image (no Docker engine), then boot, warm and snapshot it."""
    from forkd.core.images import from_image

    snap, image, built = from_image(_rt(), ref, tag, memory_mib, vcpus, tuple(warm_import), tuple(warm_run),
                                    pip=tuple(pip), apt=tuple(apt), progress=Progress(output != Fmt.table),
                                    rootfs=rootfs.value)
    t = snap.timings_ms
    data = dict(snap.to_json(), image=dict(image.meta, built_now=built))
    emit(data, output, [("TAG", "left"), ("IMAGE", "left"), ("STATE", "left"), ("ROOTFS", "right"),
                        ("AS", "left"), ("BOOT ms", "right"), ("WARM ms", "right")],
         [[snap.tag, image.id, "built" if built else "cached", size(image.meta.get("rootfs_bytes")),
           image.meta.get("rootfs", "initramfs"), ms(t.get("boot")), ms(t.get("warmup"))]])


def debian_build(packages: list[str], suite: str | None, force: bool, output: Fmt, rootfs: str = "auto") -> None:
    """`forkd image build --debian-packages ...`: a Debian rootfs image (cached by content)."""
    from forkd.core.images import build_debian

    pkgs = [p.strip() for item in packages for p in item.split(",") if p.strip()]
    image, built = build_debian(_rt(), pkgs, suite, progress=Progress(output != Fmt.table), force=force,
                                rootfs=rootfs)
    data = dict(image.meta, built_now=built, path=str(image.dir))
    emit(data, output, [("IMAGE", "left"), ("STATE", "left"), ("ROOTFS", "right"), ("AS", "left"),
                        ("INITRD", "right"), ("MIN MiB", "right"), ("PATH", "left")],
         [[image.id, "built" if built else "cached", size(image.meta.get("rootfs_bytes")),
           image.meta.get("rootfs", "initramfs"), size(image.meta.get("initrd_bytes")),
           str(image.meta.get("min_memory_mib")), str(image.dir)]])
