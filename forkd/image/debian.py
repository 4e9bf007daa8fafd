"""Guest images from a set of Debian packages: `mmdebstrap --variant=essential` plus python3 and the packages,
trimmed (docs, man pages, locales, apt lists), with forkd's init, agent, busybox and virtio modules injected
(forkd.image.rootfs.inject) and packed as an uncompressed initramfs like every other forkd image.

Cached by content: the image id hashes the suite, the mirror, the sorted package list and the versions apt
resolves for their dependency closure (on the host's package index, when the suite is the host's), so a
point release rebuilds it and an unchanged set is a cache hit. The downloaded .debs are kept in
$FORKD_HOME/cache/debian/<suite>/ so a rebuild downloads nothing new.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import stat
import time
from pathlib import Path

from forkd.base.errors import ForkdError, InvalidInput
from forkd.base.mounts import private_mounts
from forkd.base.paths import Layout
from forkd.base.procs import run
from forkd.base.settings import settings
from forkd.image import debs
from forkd.image.beneath import Tree
from forkd.image.build import BUSYBOX_PACKAGE, Image
from forkd.image.rootfs import (
    Progress,
    TooSmall,
    cached_image,
    check_rootfs_kind,
    find_python,
    finish,
    guest_sources_hash,
    inject,
    workspace,
)

DEBIAN_BUILDER_VERSION = "1"
DEFAULT_SUITE = "bookworm"
BASE_PACKAGES = ["python3"]
# bookworm's essential set pulls usrmerge, which pulls perl (~45 MB of modules) for its one-time conversion
PERL_ONLY_FOR = {"usrmerge", "libfile-find-rule-perl", "libnumber-compare-perl", "libtext-glob-perl", "perl"}
PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
SUITE_RE = re.compile(r"^[a-z][a-z0-9-]{1,30}$")
DPKG_EXCLUDES = ["/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*",
                 "/usr/share/lintian/*", "/usr/share/bash-completion/*"]
TRIM = ["usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian",
        "usr/share/bash-completion", "var/cache/apt", "var/cache/debconf/templates.dat-old", "var/lib/apt/lists",
        "var/log", "usr/lib/x86_64-linux-gnu/gconv"]


def mirror() -> str:
    return settings().debian_mirror


def check_request(suite: str, packages: list[str]) -> list[str]:
    if not SUITE_RE.match(suite):
        raise InvalidInput(f"suite {suite!r} is not a Debian suite name (e.g. bookworm)")
    bad = [p for p in packages if not PACKAGE_RE.match(p)]
    if bad:
        raise InvalidInput(f"not Debian package names: {', '.join(bad)}")
    return sorted(set(packages))


def host_codename() -> str | None:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("VERSION_CODENAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return None


def resolve_versions(suite: str, packages: list[str]) -> dict[str, str] | None:
    """The versions apt would install for python3 + packages on an empty system (the dependency closure),
    from the host's package index; None when the suite is not the host's (then only names key the cache)."""
    if suite != host_codename():
        return None
    res = run(["apt-get", "-s", "-q", "-o", "Dir::State::Status=/dev/null", "install", "--no-install-recommends",
               *BASE_PACKAGES, *packages], f"apt resolving {' '.join(packages)} for {suite}", error=InvalidInput,
              hint="check the package names (apt-cache search NAME); run 'apt-get update'")
    out = {}
    for line in res.stdout.splitlines():
        m = re.match(r"^Inst (\S+) \((\S+)", line)
        if m:
            out[m[1]] = m[2]
    return out


def _mmdebstrap(root: Path, suite: str, packages: list[str], cache: Path, progress: Progress) -> None:
    exe = shutil.which("mmdebstrap")
    if exe is None:
        raise ForkdError("mmdebstrap is not installed", hint="apt-get install mmdebstrap (scripts/setup.sh does)")
    cache.mkdir(parents=True, exist_ok=True)
    argv = [exe, "--variant=essential", "--include=" + ",".join(BASE_PACKAGES + packages),
            "--aptopt=APT::Install-Recommends \"false\"", "--skip=download/empty", "--skip=essential/unlink",
            f"--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives/ && cp -a {cache}/. \"$1\"/var/cache/apt/archives/",
            f"--customize-hook=cp -a \"$1\"/var/cache/apt/archives/. {cache}/",
            "--customize-hook=rm -f \"$1\"/var/cache/apt/archives/*.deb"]
    argv += [f"--dpkgopt=path-exclude={p}" for p in DPKG_EXCLUDES]
    argv += [suite, str(root), mirror()]
    # its binds of the host's /dev, /dev/shm, /proc, /sys into root/ live in a namespace of its own: a killed
    # mmdebstrap leaves none behind for a later delete of the work tree to walk into (forkd.base.mounts)
    argv = private_mounts(argv)
    progress(f"mmdebstrap {suite}: essential + {', '.join(BASE_PACKAGES + packages)} (downloads cached)")
    run(argv, f"mmdebstrap {suite}", tail=_apt_errors,
        hint="check the package names and that the Debian mirror is reachable (FORKD_DEBIAN_MIRROR overrides it)")


def _apt_errors(stderr: str, stdout: str) -> str:
    """apt's E: and W: lines (mmdebstrap's stderr is mostly progress), else the end of stderr."""
    tail = "\n".join(line for line in stderr.splitlines() if line.startswith(("E:", "W:")))[-800:]
    return tail or stderr.strip()[-800:]


def _trim(root: Path) -> None:
    with Tree(root) as t:
        for rel in TRIM:
            st = t.lookup(rel, follow_last=False)
            if st is not None and stat.S_ISDIR(st.st_mode):
                t.remove(rel)
                t.makedirs(rel)
        for rel in ["var/cache/apt/archives/partial", "var/lib/apt/lists/partial"]:
            t.makedirs(rel)


def _dpkg_status(root: Path) -> dict[str, tuple[str, str]]:
    """package -> (version, depends) from the rootfs' dpkg status."""
    out: dict[str, tuple[str, str]] = {}
    status = root / "var/lib/dpkg/status"
    if not status.exists():
        return out
    for para in status.read_text().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in para.splitlines() if ": " in line and not line[0].isspace())
        if "Package" in fields:
            out[fields["Package"]] = (fields.get("Version", ""), fields.get("Depends", "") + ", "
                                      + fields.get("Pre-Depends", ""))
    return out


def _trim_perl(root: Path, status: dict[str, tuple[str, str]]) -> bool:
    """Drop perl's module tree when only usrmerge's helpers need it (perl-base stays)."""
    needs = [p for p, (_, dep) in status.items() if p not in PERL_ONLY_FOR and re.search(r"(^|[ ,|])perl([ ,:(]|$)",
                                                                                        dep)]
    if needs:
        return False
    with Tree(root) as t:
        for rel in ["usr/share/perl", "usr/lib/x86_64-linux-gnu/perl"]:
            t.remove(rel)
    return True


def build_debian(layout: Layout, packages: list[str], suite: str = DEFAULT_SUITE, memory_mib: int | None = None,
                 progress: Progress = lambda s: None, force: bool = False, rootfs: str = "auto") -> tuple[Image, bool]:
    """Build (or find in the cache) the image for `packages` on `suite`. Returns (image, built_now)."""
    layout.ensure()
    pkgs = check_request(suite, packages)
    progress(f"resolving {len(pkgs)} package(s) for {suite}")
    versions = resolve_versions(suite, pkgs)
    kdeb = debs.kernel_package(layout.debs)
    bdeb = debs.download(layout.debs, BUSYBOX_PACKAGE)
    key = {"builder": DEBIAN_BUILDER_VERSION, "suite": suite, "mirror": mirror(), "packages": pkgs,
           "versions": versions, "kernel": kdeb.name, "busybox": bdeb.name, "guest": guest_sources_hash(),
           "rootfs": check_rootfs_kind(rootfs)}
    image_id = "deb-" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    try:
        hit = None if force else cached_image(layout, image_id, memory_mib)
    except TooSmall:  # built as an initramfs for a larger guest: `auto` now means the disk shape
        if rootfs != "auto":
            raise
        return build_debian(layout, packages, suite, memory_mib, progress, force, rootfs="disk")
    if hit is not None:
        return hit, False
    t0 = time.monotonic()
    with workspace(layout, image_id) as (root, out, stage):
        _mmdebstrap(root, suite, pkgs, layout.cache / "debian" / suite, progress)
        _trim(root)
        status = _dpkg_status(root)
        perl_trimmed = _trim_perl(root, status)
        python = find_python(root)
        progress(f"injecting forkd's init and agent (Python {python.version[0]}.{python.version[1]})")
        kname = inject(layout, root, python, stage, out / "vmlinuz")
        installed = {p: v for p, (v, _) in sorted(status.items())}
        meta = {"kind": "debian", "builder_version": DEBIAN_BUILDER_VERSION,
                "source": {"kind": "debian", "ref": f"debian:{suite}:{','.join(pkgs)}", "suite": suite,
                           "mirror": mirror(), "packages": pkgs, "digest": image_id},
                "resolved_versions": versions, "installed": installed, "perl_modules_trimmed": perl_trimmed,
                "python": {"path": python.path, "version": f"{python.version[0]}.{python.version[1]}"},
                "packages": {"kernel": kname, "busybox": bdeb.name},
                "build_seconds": round(time.monotonic() - t0, 2)}
        img = finish(layout, image_id, root, out, meta, memory_mib, progress, rootfs)
    return img, True
