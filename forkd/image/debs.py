"""Fetching and unpacking Debian packages (apt-get download + dpkg-deb -x), cached by file name."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from forkd.base.errors import ForkdError

KERNEL_META = "linux-image-cloud-amd64"


def _run(argv: list[str], cwd: Path | None = None) -> str:
    try:
        res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise ForkdError(f"{argv[0]} not found", hint="run on Debian 12 with apt and dpkg installed") from exc
    if res.returncode != 0:
        raise ForkdError(f"{' '.join(argv)} failed: {res.stderr.strip()[-500:]}",
                         hint="check that 'apt-get update' has run and the Debian mirror is reachable")
    return res.stdout


def cached(cache: Path, package: str) -> Path | None:
    hits = sorted(cache.glob(f"{package}_*.deb"))
    return hits[-1] if hits else None


def download(cache: Path, package: str) -> Path:
    """Return the cached .deb of `package`, downloading it with apt-get on first use."""
    cache.mkdir(parents=True, exist_ok=True)
    hit = cached(cache, package)
    if hit:
        return hit
    _run(["apt-get", "download", "-q", package], cwd=cache)
    hit = cached(cache, package)
    if not hit:
        raise ForkdError(f"apt-get download {package} produced no .deb in {cache}")
    return hit


def depends(deb: Path) -> list[str]:
    out = _run(["dpkg-deb", "-f", str(deb), "Depends"]).strip()
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
    _run(["dpkg-deb", "-x", str(deb), str(dest)])
