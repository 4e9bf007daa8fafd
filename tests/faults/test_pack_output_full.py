"""A `forkd pack` whose output filesystem fills up (a loop-mounted ext4 the test makes and fills for real).

The promise (docs/faults.md): the CLI exits non-zero naming the lack of space, the output path keeps what it held
before (a pack replaces its output whole or not at all), no temporary is left beside it nor a note in the home's
tmp/, and the same pack works once space is freed. Real CLI processes on the fake VMM driver (no VM). Needs root
(mount)."""

from __future__ import annotations

import os

import pytest

from forkd.base.outside import NOTE_PREFIX
from forkd.base.paths import Layout
from forkd.core.pack import read_manifest
from tests.conftest import BASE_TAG
from tests.fake_vmm import fake_base, fake_home, fake_rt  # noqa: F401 - fixtures
from tests.faults.mounts import fill, loop_ext4
from tests.test_pack_crash import cli

pytestmark = [pytest.mark.faults,
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting a loop filesystem needs root")]
OLD = b"what the output path held before\n"


def test_a_pack_on_a_full_output_filesystem_fails_whole_and_works_once_freed(fake_base, fake_home):  # noqa: F811
    with loop_ext4(16) as mnt:
        out = mnt / "p.tar.zst"
        out.write_bytes(OLD)
        filler = fill(mnt, leave=4096)
        res = cli("pack", "--tag", BASE_TAG, "--output-file", str(out))
        assert res.returncode == 6, (res.returncode, res.stderr)  # Unavailable: a script can tell it from a bug
        assert "no space left" in res.stderr.lower() and str(mnt) in res.stderr, res.stderr
        assert "Traceback" not in res.stderr, res.stderr
        assert out.read_bytes() == OLD, "the failed pack changed what the output path held"
        assert sorted(p.name for p in mnt.iterdir() if p.name != "lost+found") == [filler.name, out.name]
        notes = list(Layout(fake_home).tmp.glob(f"{NOTE_PREFIX}-*"))
        assert not notes, f"the failed pack left its note in the home's tmp/: {notes}"
        filler.unlink()
        res = cli("pack", "--tag", BASE_TAG, "--output-file", str(out))
        assert res.returncode == 0, res.stderr
        assert read_manifest(out)["head"] == BASE_TAG
