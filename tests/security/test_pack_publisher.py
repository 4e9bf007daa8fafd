"""Pack publisher -> host files (issue 14, item 4). A pack is written by someone else: every field of it is
hostile until checked. Each test builds its hostile pack here (no VM needed) and unpacks it into an empty store.

Attacks: a digest that is a path (`rmi` then deleted a file outside the store), a diff page number far past the
memory (a 16 TiB flat image), a decompression bomb (a few MiB of zstd writing GiBs), members adding up to more
than a pack may unpack to, a tag the reconciler owns, ownership labels; and the store's own checks: a tampered
snapshot.json on disk, and `SnapshotStore.install` refusing what is not a snapshot."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import threading
from array import array
from pathlib import Path

import pytest
import zstandard

from forkd.base.errors import ForkdError
from forkd.base.paths import Layout
from forkd.core.pack import PACK_MANIFEST, PackError, pack, unpack
from forkd.core.pack.rules import RECONCILER_TAG_RE
from forkd.core.runtime import Runtime
from forkd.reconciler import world
from forkd.spec.models import ForkBranch, ForkLayer, ForkParent
from forkd.store.snapshot import CorruptManifest, Snapshot

PAGE = 4096
KERNEL, INITRD = b"kernel" * 10, b"initrd" * 10
MEM = b"\x01" * PAGE + bytes(PAGE)  # the root's memory: two pages


@pytest.fixture
def target():
    d = Path(tempfile.mkdtemp(prefix="fksec", dir="/tmp"))
    rt2 = Runtime(Layout(d))
    yield rt2
    shutil.rmtree(rt2.layout.flat_cache.parent, ignore_errors=True)
    shutil.rmtree(d, ignore_errors=True)


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _root(tag: str = "evil", **over) -> Snapshot:
    return Snapshot(tag=tag, status="ready", created_at=0.0, memory_mib=1, vcpus=1, accel="tcg", image_id="img1",
                    kernel_sha256=_sha(KERNEL), qemu_version="7.2", memory_sha256=_sha(MEM),
                    vmstate_sha256=_sha(b"vmstate"), memory_bytes=len(MEM)).with_(**over)


def _files(root: Snapshot, vmstate: bytes = b"vmstate", layer: tuple[Snapshot, bytes, bytes] | None = None
           ) -> dict[str, bytes]:
    """A pack's files: `root` (its memory MEM), optionally a layer (record, diff.pages, diff.data), the image."""
    t = root.tag
    files = {f"snapshots/{t}/snapshot.json": json.dumps(root.to_json()).encode(), f"snapshots/{t}/vmstate": vmstate,
             f"snapshots/{t}/memory.bin": MEM}
    if layer:
        s, pages, data = layer
        files.update({f"snapshots/{s.tag}/snapshot.json": json.dumps(s.to_json()).encode(),
                      f"snapshots/{s.tag}/vmstate": b"vmstate", f"snapshots/{s.tag}/diff.pages": pages,
                      f"snapshots/{s.tag}/diff.data": data})
    image = {"id": "img1", "kernel_sha256": _sha(KERNEL), "initrd_sha256": _sha(INITRD)}
    files.update({"images/img1/vmlinuz": KERNEL, "images/img1/initrd.img": INITRD,
                  "images/img1/image.json": json.dumps(image).encode()})
    return files


def _layer(root: Snapshot, pages: list[int], tag: str = "evil2", **over) -> tuple[Snapshot, bytes, bytes]:
    raw, data = array("I", pages).tobytes(), b"\x02" * PAGE * len(pages)
    fields = dict(tag=tag, parent_tag=root.tag, parent_content_hash=root.memory_sha256, diff_pages=len(pages),
                  diff_sha256=_sha(raw + data), memory_sha256=_sha(b"composed"))
    s = root.with_(**{**fields, **over})
    return s, raw, data


def _write(path: Path, files: dict[str, bytes], sizes: dict[str, int] | None = None,
           streams: dict[str, tuple[int, object, str]] | None = None) -> Path:
    """A pack: manifest first, then `files`; `sizes` overrides declared sizes, `streams` replaces a member's
    content with (size, reader, sha256) streamed into the compressor (so a bomb is never held in memory)."""
    streams = streams or {}
    entries = []
    for p, b in files.items():
        size, digest = (len(b), _sha(b)) if p not in streams else (streams[p][0], streams[p][2])
        entries.append({"path": p, "size": (sizes or {}).get(p, size), "sha256": digest, "mode": 0o444})
    chain = list(dict.fromkeys(p.split("/")[1] for p in files if p.startswith("snapshots/")))  # root first
    m = {"format": "forkd-pack", "version": 1, "head": chain[-1], "chain": chain, "image_id": "img1",
         "images": ["img1"], "members": entries}
    with open(path, "wb") as fh, zstandard.ZstdCompressor(level=3).stream_writer(fh) as zw, \
            tarfile.open(fileobj=zw, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name, size, src in [(PACK_MANIFEST, None, json.dumps(m).encode()),
                                *[(p, streams[p][0] if p in streams else None, streams[p][1] if p in streams else b)
                                  for p, b in files.items()]]:
            info = tarfile.TarInfo(name)
            info.size = size if size is not None else len(src)
            tar.addfile(info, src if size is not None else io.BytesIO(src))
    return path


def _nothing_installed(rt2: Runtime) -> None:
    lay = rt2.layout
    assert os.listdir(lay.snapshots) == [] and os.listdir(lay.images) == [] and os.listdir(lay.tmp) == []


def _victim(tmp_path: Path, rt2: Runtime) -> tuple[Path, str]:
    """A file outside the store, and a 'digest' that is the path to it from the flat cache (minus '.mem')."""
    victim = tmp_path / "victim.mem"
    victim.write_text("precious")
    rel = os.path.relpath(victim, rt2.layout.flat_cache)
    return victim, rel[: -len(".mem")]


# -- digests that are paths -------------------------------------------------------------------------------------
def test_a_digest_that_is_a_path_is_refused_and_rmi_deletes_nothing_outside(target, tmp_path):
    victim, traversal = _victim(tmp_path, target)
    root = _root()
    layer = _layer(root, [0], memory_sha256=traversal)
    path = _write(tmp_path / "evil.tar.zst", _files(root, layer=layer))
    with pytest.raises(PackError, match="memory_sha256 .* is not a sha256"):
        unpack(target, path)
    _nothing_installed(target)
    for tag in ("evil", "evil2"):  # rmi after the refused unpack: nothing to delete, nothing outside touched
        with pytest.raises(ForkdError):
            target.store.remove(tag)
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("field", ["vmstate_sha256", "parent_content_hash", "diff_sha256", "disk_sha256"])
def test_every_digest_field_must_be_a_hex_sha256(target, tmp_path, field):
    root = _root()
    layer = _layer(root, [0], **{field: "../../../../etc/passwd"})
    with pytest.raises(PackError, match=f"{field} .* is not a sha256"):
        unpack(target, _write(tmp_path / "evil.tar.zst", _files(root, layer=layer)))
    _nothing_installed(target)


def test_a_tampered_manifest_on_disk_is_refused_and_rmi_deletes_nothing_outside(target, tmp_path):
    """The store checks records whenever it loads them: a snapshot.json edited in place names no path either."""
    victim, traversal = _victim(tmp_path, target)
    d = target.store.dir("tampered")
    d.mkdir()
    (d / "snapshot.json").write_text(json.dumps(_root("tampered", memory_sha256=traversal).to_json()))
    with pytest.raises(CorruptManifest, match="memory_sha256"):
        target.store.get("tampered")
    target.store.remove("tampered")  # rmi --force of a corrupt record: its directory only
    assert not d.exists() and victim.read_text() == "precious"
    with pytest.raises(CorruptManifest, match="not a sha256"):
        target.store.flat_cache_path(traversal)


def test_a_record_naming_another_tag_than_its_directory_is_refused(target):
    d = target.store.dir("here")
    d.mkdir()
    (d / "snapshot.json").write_text(json.dumps(_root("elsewhere").to_json()))
    with pytest.raises(CorruptManifest, match="not its directory's name"):
        target.store.get("here")


# -- diff page numbers ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pages,why", [([0xFFFFFFFF], "16 TiB"), ([2], "one past the memory"), ([1, 0], "descending"),
                                       ([1, 1], "repeated")])
def test_diff_page_numbers_must_lie_inside_the_memory(target, tmp_path, pages, why):
    root = _root()
    with pytest.raises(PackError, match="page"):
        unpack(target, _write(tmp_path / "evil.tar.zst", _files(root, layer=_layer(root, pages))))
    _nothing_installed(target)


def test_a_diff_with_more_pages_than_recorded_is_refused(target, tmp_path):
    root = _root()
    s, raw, data = _layer(root, [0, 1])
    with pytest.raises(PackError, match="recorded pages"):
        unpack(target, _write(tmp_path / "evil.tar.zst", _files(root, layer=(s.with_(diff_pages=1), raw, data))))
    _nothing_installed(target)


def test_a_memory_larger_than_the_recorded_ram_is_refused(target, tmp_path):
    root = _root(memory_mib=0)  # MEM is 8 KiB; 0 MiB of RAM cannot hold it
    with pytest.raises(PackError, match="does not match the chain's memory"):
        unpack(target, _write(tmp_path / "evil.tar.zst", _files(root)))
    _nothing_installed(target)


def test_a_well_formed_layer_pack_is_accepted(target, tmp_path):
    """Control: the same hand-made chain with valid fields unpacks, each snapshot installed by the store."""
    root = _root()
    res = unpack(target, _write(tmp_path / "ok.tar.zst", _files(root, layer=_layer(root, [0, 1]))))
    assert res["installed"] == ["images/img1", "evil", "evil2"]
    assert target.store.get("evil2").status == "ready" and target.store.ancestors("evil2")[0].tag == "evil"


# -- sizes and decompression bombs ------------------------------------------------------------------------------
def test_members_adding_up_past_the_limit_are_refused_before_writing(target, tmp_path):
    """Each member may be large, but together they may not exceed FORKD_PACK_MAX_BYTES (64 GiB by default): the
    manifest is refused before a single member is written (the data here is not even there)."""
    files = _files(_root(memory_mib=1 << 20))
    sizes = {"snapshots/evil/memory.bin": 40 << 30, "snapshots/evil/vmstate": 40 << 30}
    with pytest.raises(PackError, match="more than the .* a pack may unpack to"):
        unpack(target, _write(tmp_path / "evil.tar.zst", files, sizes=sizes))
    _nothing_installed(target)


def test_the_limit_is_a_setting(target, tmp_path, monkeypatch):
    monkeypatch.setenv("FORKD_PACK_MAX_BYTES", str(1 << 20))
    files = _files(_root(memory_mib=4), vmstate=b"v" * (1 << 20))
    with pytest.raises(PackError, match="FORKD_PACK_MAX_BYTES"):
        unpack(target, _write(tmp_path / "big.tar.zst", files))
    _nothing_installed(target)


class _Run:
    """`n` bytes of one value, read in chunks: a member that compresses ~32,000:1."""

    def __init__(self, n: int, byte: int = 1):
        self.left, self.chunk = n, bytes([byte]) * (1 << 20)

    def read(self, k: int = -1) -> bytes:
        k = self.left if k is None or k < 0 else min(k, self.left)
        out = self.chunk[:min(k, len(self.chunk))]
        self.left -= len(out)
        return out


def _run_sha(n: int, byte: int = 1) -> str:
    h, r = hashlib.sha256(), _Run(n, byte)
    while b := r.read(1 << 20):
        h.update(b)
    return h.hexdigest()


def _disk_use(d: Path) -> int:
    """Blocks under d; files and directories removed while it walks (the unpack cleans up) are skipped."""
    total = 0
    for root, dirs, files in os.walk(d):  # os.walk ignores a directory that vanished under it; rglob raised
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def test_a_zstd_bomb_is_stopped_early(target, tmp_path):
    """1 GiB of 0x01 bytes (a vmstate: not sparse, every byte written) in a pack of well under 1 MiB: unpacking
    stops once it has written the first 64 MiB plus 1000 bytes per compressed byte, long before 1 GiB."""
    n = 1 << 30
    files = _files(_root(memory_mib=2048))
    path = _write(tmp_path / "bomb.tar.zst", files, streams={"snapshots/evil/vmstate": (n, _Run(n), _run_sha(n))})
    packed = path.stat().st_size
    assert packed < 1 << 20
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.wait(0.005):
            peak[0] = max(peak[0], _disk_use(target.layout.tmp))

    t = threading.Thread(target=watch)
    t.start()
    try:
        with pytest.raises(PackError, match="decompression bomb"):
            unpack(target, path)
    finally:
        stop.set()
        t.join()
    assert peak[0] <= (64 << 20) + 1000 * packed + (2 << 20), peak[0]
    _nothing_installed(target)


def test_zeros_are_left_as_holes_and_cost_no_disk(target, tmp_path):
    """A member of zeros (here 256 MiB) writes holes: legitimate sparse memory is not mistaken for a bomb."""
    n = 256 << 20
    zeros_sha = _run_sha(n, 0)
    root = _root(memory_mib=512, vmstate_sha256=zeros_sha)
    stream = {"snapshots/evil/vmstate": (n, _Run(n, 0), zeros_sha)}
    path = _write(tmp_path / "zeros.tar.zst", _files(root), streams=stream)
    unpack(target, path)
    vm = target.store.vmstate_path("evil")
    assert vm.stat().st_size == n and vm.stat().st_blocks * 512 < (1 << 20)


# -- tags and labels the reconciler owns ------------------------------------------------------------------------
def _parent() -> ForkParent:
    return ForkParent.model_validate({"apiVersion": "forkd.dev/v1alpha1", "kind": "ForkParent",
                                      "metadata": {"name": "web"}, "spec": {"image": {"builtin": "python"}}})


def test_the_reconciler_tag_shapes_are_what_a_pack_may_not_claim():
    p = _parent()
    layer = ForkLayer.model_validate({"apiVersion": "forkd.dev/v1alpha1", "kind": "ForkLayer",
                                      "metadata": {"name": "deps"}, "spec": {"from": "web"}})
    branch = ForkBranch.model_validate({"apiVersion": "forkd.dev/v1alpha1", "kind": "ForkBranch",
                                        "metadata": {"name": "br"}, "spec": {"sandbox": "pool/p"}})
    tags = [world.parent_tag(p), world.layer_tag(layer, world.parent_tag(p)), world.branch_tag(branch),
            world.compact_tag(world.parent_tag(p))]
    assert all(RECONCILER_TAG_RE.match(t) for t in tags), tags
    assert not any(RECONCILER_TAG_RE.match(t) for t in ("base", "py-base", "evil", "acme-py.1", "cmp-1"))


def test_a_pack_claiming_a_reconciler_tag_is_refused(target, tmp_path):
    """A ForkParent's snapshot tag is '<name>-<spec hash>': a pack holding it would be adopted by the reconciler
    as the parent it builds from that spec (and every pool child would run the publisher's memory)."""
    tag = world.parent_tag(_parent())
    with pytest.raises(PackError, match="reconciler owns") as err:
        unpack(target, _write(tmp_path / "evil.tar.zst", _files(_root(tag))))
    assert "snapshot compact" in (err.value.hint or "")
    _nothing_installed(target)


def test_ownership_labels_are_dropped_and_provenance_recorded(target, tmp_path):
    labels = {"forkd.dev/parent": "web", "forkd.dev/spec-hash": "0" * 64, "forkd.dev/source": "local",
              "team": "a"}
    path = _write(tmp_path / "lab.tar.zst", _files(_root(labels=labels)))
    unpack(target, path)
    got = target.store.get("evil").labels
    assert got == {"team": "a", "forkd.dev/source": f"pack:{_sha(path.read_bytes())}"}


# -- the store installs ----------------------------------------------------------------------------------------
def test_install_refuses_what_is_not_a_snapshot(target, tmp_path):
    staged = target.layout.tmp / "staged"
    staged.mkdir()
    (staged / "vmstate").write_bytes(b"vmstate")
    (staged / "memory.bin").symlink_to("/etc/passwd")
    with pytest.raises(CorruptManifest, match="regular files only"):
        target.store.install(staged, _root())
    (staged / "memory.bin").unlink()
    (staged / "memory.bin").write_bytes(MEM)
    (staged / "extra").write_bytes(b"x")
    with pytest.raises(CorruptManifest, match="holds"):
        target.store.install(staged, _root())
    assert os.listdir(target.layout.snapshots) == []


def test_packing_a_reconciler_tag_is_refused_with_the_way_out(target, tmp_path):
    """Nobody could unpack it: `forkd pack` says so at once and how to share it under another tag."""
    tag = world.parent_tag(_parent())
    staged = target.layout.tmp / "staged"
    staged.mkdir()
    (staged / "vmstate").write_bytes(b"vmstate")
    (staged / "memory.bin").write_bytes(MEM)
    target.store.install(staged, _root(tag))
    with pytest.raises(PackError, match="reconciler owns") as err:
        pack(target, tag, tmp_path / "out.tar.zst")
    assert f"--from {tag}" in (err.value.hint or "") and not (tmp_path / "out.tar.zst").exists()
