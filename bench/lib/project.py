"""The workload the eval and rollout benchmarks run in every sandbox: a small pure-Python project (a package and
its unittest suite, written here) whose dependencies are real wheels from the package index, staged once as a
directory that each provider's template or image holds at ROOT.

A sample's setup is what `sample.sh` does: check the project out into a fresh working directory (unpack its
tarball), install its dependencies there (unpack each pure-Python wheel into `.deps`, which is all pip does for
them), optionally apply a patch, byte-compile, and run its tests; it writes `result.txt` ("ok N" or "fail N").
Only /bin/sh, tar and python3 are needed, so the same script runs on the host, in a forkd child and in a
container of the guest's rootfs."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = "/opt/bench"  # where templates and images hold the staged directory
WHEELS = ("attrs==26.1.0", "more-itertools==11.2.1")  # pure-Python wheels; the guest has Python 3.11

CORE = '''\
"""Tally: counts and windows over records, on attrs and more-itertools."""
import attrs
import more_itertools

SCALE = 1


@attrs.frozen
class Entry:
    name: str
    amount: int = attrs.field(validator=attrs.validators.ge(0))


def total(entries):
    return SCALE * sum(e.amount for e in entries)


def windows(entries, n):
    return [sum(e.amount for e in w) for w in more_itertools.windowed(entries, n) if None not in w]


def top(entries, k):
    return [e.name for e in sorted(entries, key=lambda e: (-e.amount, e.name))[:k]]


def chunks(entries, n):
    return [[e.name for e in c] for c in more_itertools.chunked(entries, n)]
'''

TESTS = '''\
import unittest

import attrs
from tally.core import Entry, chunks, top, total, windows

E = [Entry("a", 3), Entry("b", 5), Entry("c", 1), Entry("d", 5)]


class TallyTest(unittest.TestCase):
    def test_total(self):
        self.assertEqual(total(E), 14)

    def test_windows(self):
        self.assertEqual(windows(E, 2), [8, 6, 6])

    def test_top(self):
        self.assertEqual(top(E, 2), ["b", "d"])

    def test_chunks(self):
        self.assertEqual(chunks(E, 3), [["a", "b", "c"], ["d"]])

    def test_negative_refused(self):
        with self.assertRaises(ValueError):
            Entry("x", -1)

    def test_frozen(self):
        with self.assertRaises(attrs.exceptions.FrozenInstanceError):
            E[0].amount = 9

    def test_many(self):
        many = [Entry(str(i), i) for i in range(2000)]
        self.assertEqual(total(many), 1999 * 1000)
        self.assertEqual(len(windows(many, 10)), 1991)
'''

# $1: the staged directory, $2: the working directory to create, $3: a patch (sed expression on tally/core.py)
SAMPLE_SH = '''\
set -e
root=$1 work=$2 patch=$3
rm -rf "$work" && mkdir -p "$work" && cd "$work"
tar -xf "$root/project.tar"
for w in "$root"/wheels/*.whl; do python3 -m zipfile -e "$w" .deps; done
if [ -n "$patch" ]; then sed -i "$patch" tally/core.py; fi
python3 -m compileall -q tally tests > /dev/null
if PYTHONPATH=.deps:. python3 -m unittest -q 2> test.log; then r=ok; else r=fail; fi
echo "$r $(grep -c . test.log)" > result.txt
cat result.txt
'''


def fetch_wheels(cache: Path) -> list[Path]:
    """The dependency wheels, downloaded once from the package index into `cache` (pip, no dependencies)."""
    cache.mkdir(parents=True, exist_ok=True)
    want = [w.split("==") for w in WHEELS]
    have = [next(iter(cache.glob(f"{n.replace('-', '_')}-{v}-*.whl")), None) for n, v in want]
    if None in have:
        res = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                              "--python-version", "3.11", "-d", str(cache), *WHEELS], capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"pip download {' '.join(WHEELS)} failed (the package index is needed once): "
                               f"{res.stderr[-1500:]}")
        have = [next(iter(cache.glob(f"{n.replace('-', '_')}-{v}-*.whl"))) for n, v in want]
    return list(have)


def _tar(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def stage(dest: Path, wheel_cache: Path) -> dict[str, bytes]:
    """Write the staged directory to `dest` (project.tar, wheels/, sample.sh); returns its files by relative
    path, for uploading into a template."""
    files = {"project.tar": _tar({"tally/__init__.py": "", "tally/core.py": CORE, "tests/__init__.py": "",
                                  "tests/test_core.py": TESTS}),
             "sample.sh": SAMPLE_SH.encode()}
    for w in fetch_wheels(wheel_cache):
        files[f"wheels/{w.name}"] = w.read_bytes()
    for rel, data in files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)
    return files


def content_id(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + hashlib.sha256(files[rel]).digest())
    return h.hexdigest()[:12]


def sample_argv(root: str, work: str, patch: str = "") -> list[str]:
    return ["/bin/sh", f"{root}/sample.sh", root, work, patch]


def patches(n: int) -> list[str]:
    """`n` different small patches of tally/core.py: the i-th scales totals by i % 3 + 1, so a third of them keep
    the tests passing (scale 1) and the rest break test_total and test_many."""
    return [f"s/^SCALE = 1$/SCALE = {i % 3 + 1}/" for i in range(n)]
