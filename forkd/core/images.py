"""Which guest image a parent boots: resolve an ImageRef (as a dict, the way specs hold it) to a built image id.

    {builtin: python}                         the default image (Debian kernel + busybox + Python 3.11)
    {oci: {ref: PATH}}                        an OCI image layout directory or a `docker save` tarball
    {oci: {ref: docker://HOST/NAME:TAG}}      a registry image, pulled pinned to its digest (forkd.image.registry)
    {debian: {suite: bookworm, packages: []}} a Debian rootfs from packages (mmdebstrap), cached by content
    {debian: {preset: full}}                  a named package set first (forkd.base.presets)

oci and debian take `rootfs: auto|initramfs|disk` (see forkd.image.rootfs).

A spec's oci ref is a host path named by whoever writes specs, so it must resolve (every symlink followed) beneath
an allowed root: $FORKD_HOME/image-sources, or a directory the operator lists in FORKD_IMAGE_ROOTS. The CLI's
`forkd from-image PATH` (the local root user, or a daemon caller holding its token) may name any path.
A spec's registry reference must name a registry the operator lists in FORKD_IMAGE_REGISTRIES; it is pulled over
verified TLS unless FORKD_INSECURE_REGISTRIES lists it, with the credentials skopeo finds in the daemon's
environment (REGISTRY_AUTH_FILE, auth.json, ~/.docker/config.json): a spec names no file and no credential.

Every kind is built once and cached by content under $FORKD_HOME/images/<id>; this only builds what is missing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forkd.base.errors import Conflict, ForkdError, InvalidInput
from forkd.base.settings import settings
from forkd.core.requests import ParentBuild

if TYPE_CHECKING:
    from forkd.base.cancel import CancelToken
    from forkd.core.runtime import Runtime

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


IMAGE_SOURCES = "image-sources"  # under $FORKD_HOME: where specs may always take OCI images from


def image_roots(rt: Runtime) -> list[Path]:
    """The directories a spec's oci ref may name an image under (resolved)."""
    extra = [p.strip() for p in settings().image_roots.split(":") if p.strip()]
    return [Path(os.path.realpath(p)) for p in [rt.layout.home / IMAGE_SOURCES, *extra]]


def check_spec_ref(rt: Runtime, ref: str) -> str:
    """`ref` resolved (every symlink followed) if it lies beneath an allowed root, else InvalidInput: a spec may not
    make forkd read an arbitrary host path as an image (/etc, another user's files, a device ...)."""
    if not ref or "\0" in ref or not os.path.isabs(ref):
        raise InvalidInput(f"image: oci ref {ref!r} must be an absolute path",
                           hint=f"put the image under {rt.layout.home / IMAGE_SOURCES} and name it by its full path")
    real = Path(os.path.realpath(ref))
    roots = image_roots(rt)
    if any(real == r or r in real.parents for r in roots):
        return str(real)
    raise InvalidInput(f"image: oci ref {ref} (resolved: {real}) is not under a directory specs may take images from "
                       f"({', '.join(map(str, roots))})",
                       hint=f"copy the image under {roots[0]}, or allow its directory for specs: "
                            "FORKD_IMAGE_ROOTS=/dir1:/dir2 in the daemon's (operator's) environment; "
                            "`forkd from-image PATH` on the host takes any path")


def spec_registry(ref: str):
    """The registry options for a spec's `docker://` ref, or InvalidInput when the operator has not allowed its
    registry (a spec may not make forkd reach an arbitrary host)."""
    from forkd.image.registry import RegistryOptions, parse

    host = parse(ref).host
    allowed = {h.strip() for h in settings().image_registries.split(",") if h.strip()}
    if host not in allowed:
        raise InvalidInput(f"image: oci ref {ref}: registry {host} is not one specs may pull from "
                           f"({', '.join(sorted(allowed)) or 'none is allowed'})",
                           hint=f"allow it in the daemon's (operator's) environment: FORKD_IMAGE_REGISTRIES={host}; "
                                f"`forkd from-image {ref}` on the host needs no allowance")
    insecure = {h.strip() for h in settings().insecure_registries.split(",") if h.strip()}
    return RegistryOptions(tls_verify=host not in insecure)


def ensure_image(rt: Runtime, image_ref: dict[str, Any] | None, memory_mib: int | None = None,
                 progress: Progress = _quiet, pip: tuple[str, ...] = ()) -> str:
    """Build (or find) the image `image_ref` names and return its id. With `memory_mib`, refuse an image
    whose initramfs would not fit in that much guest RAM (before anything boots)."""
    ref = {k: v for k, v in (image_ref or {}).items() if v is not None} or {"builtin": "python"}
    if len(ref) != 1:
        raise InvalidInput(f"image: give exactly one of builtin, oci, debian (got {', '.join(sorted(ref))})")
    kind, value = next(iter(ref.items()))
    if kind == "builtin":
        if value != "python":
            raise InvalidInput(f"image: builtin {value!r} is unknown (there is only 'python')")
        image, _ = rt.build_image(progress)
        return image.id
    if kind == "oci":
        from forkd.image.container import from_image
        from forkd.image.registry import is_registry_ref

        path = value.get("ref") if isinstance(value, dict) else value
        if not path:
            raise InvalidInput("image: oci needs ref: PATH (an OCI layout directory or a docker save tarball) or "
                               "docker://HOST/NAME:TAG")
        rootfs = (value.get("rootfs") if isinstance(value, dict) else None) or "auto"
        if is_registry_ref(path):
            image, _ = from_image(rt.layout, path, memory_mib=memory_mib, pip=tuple(pip), progress=progress,
                                  rootfs=rootfs, registry=spec_registry(path))
            return image.id
        image, _ = from_image(rt.layout, check_spec_ref(rt, path), memory_mib=memory_mib, pip=tuple(pip),
                              progress=progress, rootfs=rootfs)
        return image.id
    if kind == "debian":
        from forkd.base.presets import preset_packages
        from forkd.image.debian import DEFAULT_SUITE, build_debian

        value = value or {}
        try:
            packages = preset_packages(value.get("preset"), list(value.get("packages") or []))
        except ValueError as exc:
            raise InvalidInput(f"image: debian: {exc}") from None
        image, _ = build_debian(rt.layout, packages, value.get("suite") or DEFAULT_SUITE,
                                memory_mib=memory_mib, progress=progress, rootfs=value.get("rootfs") or "auto")
        return image.id
    raise InvalidInput(f"image: unknown kind {kind!r} (use builtin, oci or debian)")


def build_oci(rt: Runtime, ref: str, memory_mib: int | None = None, pip: tuple[str, ...] = (),
              progress: Progress = _quiet, force: bool = False, rootfs: str = "auto", any_path: bool = False,
              registry: dict[str, Any] | None = None):
    """The image for an OCI layout / docker save tarball / docker:// reference. Returns (Image, built_now). A path
    must lie under an allowed root (check_spec_ref: a spec names it), a registry be allowed for specs
    (spec_registry), unless `any_path` (forkd from-image, run by the host's user, with its `registry` options:
    authfile, cert_dir, tls_verify)."""
    from forkd.image.container import from_image
    from forkd.image.registry import RegistryOptions, is_registry_ref

    if is_registry_ref(ref):
        opts = RegistryOptions(**registry) if any_path and registry else None if any_path else spec_registry(ref)
        return from_image(rt.layout, ref, memory_mib=memory_mib, pip=pip, progress=progress, force=force,
                          rootfs=rootfs, registry=opts)
    if registry:
        raise InvalidInput(f"{ref}: registry options (--authfile, --cert-dir, --insecure-registry) apply to "
                           "docker://... references only")
    return from_image(rt.layout, ref if any_path else check_spec_ref(rt, ref), memory_mib=memory_mib, pip=pip,
                      progress=progress, force=force, rootfs=rootfs)


def build_debian(rt: Runtime, packages: list[str], suite: str | None = None, memory_mib: int | None = None,
                 progress: Progress = _quiet, force: bool = False, rootfs: str = "auto"):
    """forkd image build --debian-packages: returns (Image, built_now)."""
    from forkd.image.debian import DEFAULT_SUITE, build_debian

    return build_debian(rt.layout, packages, suite or DEFAULT_SUITE, memory_mib=memory_mib, progress=progress,
                        force=force, rootfs=rootfs)


def from_image(rt: Runtime, ref: str, tag: str, memory_mib: int = 512, vcpus: int = 1,
               warm_imports: tuple[str, ...] = (), warm_run: tuple[str, ...] = (), pip: tuple[str, ...] = (),
               apt: tuple[str, ...] = (), progress: Progress = _quiet, labels: dict[str, str] | None = None,
               rootfs: str = "auto", registry: dict[str, Any] | None = None, cancel: CancelToken | None = None):
    """Build the image for `ref` (cached) and boot, warm and snapshot it as `tag`. Returns (Snapshot, Image, built).
    `cancel`: the snapshot's build checks it (forkd.core.pipeline.job); the image build sees it only through
    `progress`, when the caller's progress checks it.
    A registry image's snapshot carries its reference and pinned digest as labels (forkd.dev/image-ref,
    forkd.dev/image-digest)."""
    from forkd.base.names import check_tag

    check_tag(tag)
    if apt:
        raise InvalidInput(f"--apt {' '.join(apt)}: installing Debian packages into an arbitrary OCI rootfs would mean "
                           "running its package manager at build time (and the guest has no network)",
                           hint="bake them into the container image (RUN apt-get install ...), or build from "
                                "Debian packages: forkd image build --debian-packages PKG, or image: {debian: "
                                "{packages: [...]}} in a ForkParent")
    try:  # refuse before a long image build, not after it
        old = rt.store.get(tag)
    except ForkdError:
        old = None
    if old is not None and old.status != "failed":
        raise Conflict(f"snapshot {tag!r} already exists ({old.status})",
                       hint=f"forkd snapshot rm {tag}, or pick another --tag")
    image, built = build_oci(rt, ref, memory_mib=memory_mib, pip=pip, progress=progress, rootfs=rootfs,
                             any_path=True, registry=registry)
    source = image.meta.get("source") or {}
    pin = {"forkd.dev/image-ref": ref, "forkd.dev/image-digest": source["digest"]} \
        if source.get("kind") == "registry" else {}
    snap = rt.create_snapshot(ParentBuild.of(tag=tag, memory_mib=memory_mib, vcpus=vcpus, warm_imports=warm_imports,
                                             warm_run=warm_run,
                                             labels={"forkd.dev/image": image.id, **pin, **(labels or {})},
                                             image_id=image.id), progress=progress, cancel=cancel)
    return snap, image, built
