"""What a test's home starts with: the default guest image and the accelerator decision, copied from the home
scripts/setup.sh filled before the tests ran (`forkd image build` and `forkd doctor` in $FORKD_HOME, default
/var/lib/forkd), so each pytest worker's session home neither builds the same image nor boots the KVM probe again.

Both are caches, keyed by what they were made from: forkd.image.build names the default image by a hash of its Debian
packages and the guest sources, and the accelerator decision is kept per kernel hash (Runtime.accelerator), so a
home whose copy is not what this tree would make (a stale source home, a changed agent) builds and probes its own as
before. Tests of image building and of the probe use homes of their own, which are not seeded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from forkd.base.paths import Layout
from forkd.base.settings import read_one

SOURCE = Layout(Path(read_one("home")))  # read at import: before the session fixture points FORKD_HOME elsewhere


def seed_home(layout: Layout, source: Layout = SOURCE) -> bool:
    """Copy `source`'s default image, downloaded packages and accelerator decisions into `layout` (a new home).
    False, copying no image, when `source` has no default image or is `layout` itself."""
    default = source.images / "default"
    try:
        if layout.home.resolve() == source.home.resolve() or not default.is_file():
            return False
        image_id = default.read_text().strip()
    except OSError:
        return False
    if not image_id or not (source.images / image_id / "image.json").is_file():
        return False
    layout.ensure()
    staging = layout.images / f".seed-{image_id}"  # renamed into place whole: a part-copied image is never taken
    try:
        if source.debs.is_dir():
            shutil.copytree(source.debs, layout.debs, dirs_exist_ok=True)
        shutil.copytree(source.images / image_id, staging)
        staging.rename(layout.images / image_id)
        shutil.copy(default, layout.images / "default")
        if source.accel_cache.is_file():
            shutil.copy(source.accel_cache, layout.accel_cache)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        return False
    return True
