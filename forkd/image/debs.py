"""Fetching and unpacking Debian packages (apt-get download + dpkg-deb -x), cached by file name."""

from __future__ import annotations

import re
from pathlib import Path

from forkd.base.errors import ForkdError
from forkd.base.procs import run

KERNEL_META = "linux-image-cloud-amd64"
HINT = "run on Debian 12 with apt and dpkg installed, after 'apt-get update', with the Debian mirror reachable"


def cached(cache: Path, package: str) -> Path | None:
    hits = sorted(cache.glob(f"{package}_*.deb"))
    return hits[-1] if hits else None


def download(cache: Path, package: str) -> Path:
    """Return the cached .deb of `package`, downloading it with apt-get on first use."""
    cache.mkdir(parents=True, exist_ok=True)
    hit = cached(cache, package)
    if hit:
        return hit
    run(["apt-get", "download", "-q", package], f"downloading {package}", cwd=cache, hint=HINT)
    hit = cached(cache, package)
    if not hit:
        raise ForkdError(f"apt-get download {package} produced no .deb in {cache}")
    return hit


def depends(deb: Path) -> list[str]:
    out = run(["dpkg-deb", "-f", deb, "Depends"], f"reading {deb.name}", hint=HINT).stdout.strip()
    return [re.split(r"[\s(]", d.strip())[0] for d in out.split(",") if d.strip()]


def kernel_package(cache: Path) -> Path:
    """The concrete linux-image-*-cloud-amd64 package the meta package points at."""
    meta = download(cache, KERNEL_META)
    for dep in depends(meta):
        if dep.startswith("linux-image-"):
            return download(cache, dep)
    raise ForkdError(f"{meta.name} names no linux-image dependency")


def extract(deb: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    run(["dpkg-deb", "-x", deb, dest], f"unpacking {deb.name}", hint=HINT)
