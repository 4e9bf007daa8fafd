"""Image author -> host (SECURITY.md section 3): hostile OCI images built inside the test.

The attacker writes the image (its layers, symlinks, hard links, modes) or a spec naming an image path; the victim
files live in the test's own temporary directories (never a real host file). Local-user probes run as uid 65534
(`setpriv`). Every unpacking attack runs twice: with openat2(RESOLVE_IN_ROOT) and with the fd-by-fd walk used
where the kernel lacks it."""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from forkd.base.errors import InvalidInput
from forkd.base.paths import Layout
from forkd.core import images as core_images
from forkd.image import container, debs, oci, pycheck, rootfs
from forkd.image.build import BUSYBOX_PACKAGE
from tests.oci_images import LAYER_TAR, _write_layout

try:
    from forkd.image import beneath
except ImportError:  # the code before the fix (to check these tests fail on it)
    beneath = None

NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


@pytest.fixture(params=["openat2", "walk"])
def resolver(request, monkeypatch):
    if beneath is None:
        return "before the fix"
    if request.param == "openat2" and not beneath.have_openat2():
        pytest.skip("this kernel has no openat2")
    if request.param == "walk":
        monkeypatch.setattr(beneath, "have_openat2", lambda: False)
    return request.param


def _tar(entries: list[tuple]) -> bytes:
    """A layer from (name, kind, payload, mode[, uid]) with kind file|dir|sym|hard."""
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, payload, mode, *rest in entries:
            ti = tarfile.TarInfo(name)
            ti.mode, ti.uid, ti.gid = mode, (rest[0] if rest else 0), 0
            ti.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE,
                       "hard": tarfile.LNKTYPE}[kind]
            if kind in ("sym", "hard"):
                ti.linkname = payload
                tar.addfile(ti)
            elif kind == "dir":
                tar.addfile(ti)
            else:
                ti.size = len(payload)
                tar.addfile(ti, io.BytesIO(payload))
    return buf.getvalue()


def _unpack(root: Path, *layers: list[tuple]) -> oci.UnpackStats:
    src = oci.Source("test", "test", "sha256:x")
    for i, entries in enumerate(layers):
        data = _tar(entries)
        src.layers.append(oci.Layer(f"l{i}", "tar", lambda data=data: io.BytesIO(data)))
    return oci.unpack(src, root)


def _victim(tmp_path: Path, name: str = "victim") -> Path:
    v = tmp_path / "host" / name
    v.parent.mkdir(parents=True, exist_ok=True)
    v.write_text("host file, untouched\n")
    return v


def _climb(root: Path, target: Path) -> str:
    """A symlink target that is lexically balanced (as many `..` as names before them) but, through the
    `s -> .` symlink at the rootfs' top, climbs to the host's `/` and then names `target`."""
    k = len(root.parts)  # enough `..` to reach / from the rootfs
    return "s/" * k + "../" * k + str(target).lstrip("/")


def _escaping_links(root: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            if os.path.islink(p):
                real = os.path.realpath(p)
                if not (real == str(root) or real.startswith(str(root) + "/")):
                    out.append(f"{p} -> {real}")
    return out


# ---------------------------------------------------------------- symlinks, hard links, `..` (unpacking)
def test_symlink_chain_through_parent_symlink_refused(tmp_path, resolver):
    """(c) `t -> s/s/.../../../..etc` is balanced lexically but `s -> .` makes it climb to the host's /."""
    victim = _victim(tmp_path)
    root = tmp_path / "root"
    with pytest.raises(oci.UnsafeImage, match="points above the rootfs"):
        _unpack(root, [("s", "sym", ".", 0o777), ("t", "sym", _climb(root, victim), 0o777)])
    assert not _escaping_links(root)


def test_chain_through_deeper_parent_symlinks_refused(tmp_path, resolver):
    """The climbing link sits in a directory reached through a parent symlink: `d/l` where `d -> a/b/up` and
    `a/b/up -> ../..`: `d/l -> ../x` resolves from the rootfs' top."""
    victim = _victim(tmp_path)
    root = tmp_path / "root"
    with pytest.raises(oci.UnsafeImage, match="points above the rootfs"):
        _unpack(root, [("a/", "dir", None, 0o755), ("a/b/", "dir", None, 0o755), ("a/b/up", "sym", "../..", 0o777),
                       ("d", "sym", "a/b/up", 0o777), ("d/l", "sym", "../" + str(victim).lstrip("/"), 0o777)])
    assert not _escaping_links(root)


def test_writes_through_planted_symlinks_stay_inside(tmp_path, resolver):
    """Absolute symlinks, relative ones to the top, and directories reached through them: a later layer's
    files, directories, fifos and whiteouts land inside the rootfs; the host directory is untouched."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "keep").write_text("keep\n")
    root = tmp_path / "root"
    _unpack(root,
            [("abs", "sym", str(host), 0o777), ("top", "sym", "/", 0o777), ("rel", "sym", "abs/..", 0o777)],
            [("abs/pwned", "file", b"x", 0o644), ("top/" + str(host).lstrip("/") + "/pwned2", "file", b"y", 0o644),
             ("abs/sub/", "dir", None, 0o755), ("rel/.wh.keep", "file", b"", 0o644),
             ("abs/.wh.keep", "file", b"", 0o644), ("abs/keepdir/", "dir", None, 0o755)])
    assert sorted(os.listdir(host)) == ["keep"] and (host / "keep").read_text() == "keep\n"
    inside = root / str(host).lstrip("/")
    assert (inside / "pwned").read_bytes() == b"x" and (inside / "pwned2").read_bytes() == b"y"
    assert (inside / "sub").is_dir()


def test_hard_links_cannot_reach_host_files(tmp_path, resolver):
    victim = _victim(tmp_path)
    rel = str(victim).lstrip("/")
    root = tmp_path / "root"
    for i, entries in enumerate([
        [("h", "hard", "../" * 12 + rel, 0o644)],                                         # `..` in the name
        [("h", "hard", "/" + rel, 0o644)],                                                 # absolute name
        [("up", "sym", "/", 0o777), ("h", "hard", "up/" + rel, 0o644)],                    # through a symlink
        [("a/", "dir", None, 0o755), ("a/up", "sym", "..", 0o777), ("h", "hard", "a/up/../../" + rel, 0o644)],
    ]):
        with pytest.raises(oci.UnsafeImage):
            _unpack(root.with_name(f"root{i}"), entries)
    assert victim.stat().st_nlink == 1 and victim.read_text() == "host file, untouched\n"


@pytest.mark.parametrize("name", ["../escape", "a/../../escape", "/abs", "a/b/../../../escape"])
def test_dotdot_and_absolute_member_names_refused(tmp_path, resolver, name):
    with pytest.raises(oci.UnsafeImage):
        _unpack(tmp_path / "root", [(name, "file", b"x", 0o644)])
    assert not (tmp_path / "escape").exists()


def test_setuid_bits_never_on_the_host_copy(tmp_path, resolver):
    root = tmp_path / "root"
    stats = _unpack(root, [("bin/", "dir", None, 0o755), ("bin/su", "file", b"\x7fELF", 0o4755),
                           ("bin/wall", "file", b"\x7fELF", 0o2755), ("bin/both", "file", b"x", 0o6777),
                           ("shared/", "dir", None, 0o2775)])
    for n in ("su", "wall", "both"):
        assert not (root / "bin" / n).stat().st_mode & (stat.S_ISUID | stat.S_ISGID), n
    assert (root / "bin/su").stat().st_mode & 0o777 == 0o755
    assert stats.setid_stripped == ["bin/both", "bin/su", "bin/wall"]
    assert (root / "shared").stat().st_mode & stat.S_ISGID  # a setgid directory only sets new files' group


# ---------------------------------------------------------------- the .pth file (--pip) and the other writers
def test_pth_not_written_through_planted_symlink(tmp_path, resolver):
    """(b) forkd-pip.pth planted as a symlink to a host file (absolute, and climbing through `s -> .`)."""
    victim, victim2 = _victim(tmp_path), _victim(tmp_path, "victim2")
    root = tmp_path / "root"
    site = "usr/lib/python3/dist-packages"
    _unpack(root, [("usr/", "dir", None, 0o755), ("usr/lib/", "dir", None, 0o755),
                   ("usr/lib/python3/", "dir", None, 0o755), (site + "/", "dir", None, 0o755),
                   (site + "/forkd-pip.pth", "sym", str(victim), 0o777)])
    (root / "s").symlink_to(".")  # as if a later layer (or a host tool) made it: the writer must not care
    (root / "usr/lib/python3/dist-packages2").symlink_to("../../../" + _climb(root, victim2.parent))
    py = rootfs.GuestPython("/usr/bin/python3", (3, 11), "/" + site)
    installed = rootfs.pip_install(root, py, ["six"], lambda s: None)
    assert installed and installed[0].startswith("six-")
    assert victim.read_text() == "host file, untouched\n"
    assert (root / site / "forkd-pip.pth").read_text() == "/forkd/site-packages\n"
    assert not (root / site / "forkd-pip.pth").is_symlink()
    rootfs.pip_install(root, rootfs.GuestPython("/usr/bin/python3", (3, 11), "/usr/lib/python3/dist-packages2"),
                       ["six"], lambda s: None)
    assert sorted(os.listdir(victim2.parent)) == ["victim", "victim2"]
    assert victim2.read_text() == "host file, untouched\n"


# ---------------------------------------------------------------- a whole from-image build, probed as uid 65534
def _public_home(rt) -> Layout:
    """A FORKD_HOME other users may traverse (0755, like /var/lib/forkd), with the session's debs."""
    d = Path(tempfile.mkdtemp(prefix="fkimg", dir="/tmp"))
    os.chmod(d, 0o755)
    layout = Layout(d)
    debs.kernel_package(rt.layout.debs)
    debs.download(rt.layout.debs, BUSYBOX_PACKAGE)
    layout.debs.mkdir(parents=True)
    for deb in rt.layout.debs.glob("*.deb"):
        shutil.copy2(deb, layout.debs / deb.name)
    return layout


def _nobody_finds_setuid_root(home: Path) -> list[str]:
    """What uid 65534 reaches under `home` that is setuid/setgid and owned by root, and what it gets running it."""
    found = subprocess.run(NOBODY + ["find", str(home), "-user", "0", "-perm", "/6000", "-type", "f"],
                           capture_output=True, text=True).stdout.split()
    ran = [subprocess.run(NOBODY + [p, "-u"], capture_output=True, text=True).stdout.strip() for p in found]
    return [f"{p} (euid {r or '?'})" for p, r in zip(found, ran, strict=True)]


def _stdlib_stubs(stdlib: str) -> list[tuple]:
    """Empty files named as the modules forkd's agent imports (forkd.image.pycheck reads names, runs nothing)."""
    mods = [m for m in pycheck.agent_modules() if pycheck._files_only(m)]
    return [(stdlib + "/", "dir", None, 0o755)] + [(f"{stdlib}/{m}.py", "file", b"", 0o644) for m in mods]


def _hostile_image(tmp_path: Path, victims: dict[str, Path]) -> Path:
    site = "usr/lib/python3/dist-packages"
    layer = _tar([("usr/", "dir", None, 0o755), ("usr/bin/", "dir", None, 0o755),
                  ("usr/bin/python3.11", "file", b"#!/bin/sh\n", 0o755),
                  ("usr/bin/python3", "sym", "python3.11", 0o777),
                  ("usr/bin/suidprobe", "file", Path("/usr/bin/id").read_bytes(), 0o4755, 0),
                  ("usr/lib/", "dir", None, 0o755), ("usr/lib/python3/", "dir", None, 0o755),
                  *_stdlib_stubs("usr/lib/python3.11"),  # passes the build's check of the agent's modules
                  (site + "/", "dir", None, 0o755), (site + "/forkd-pip.pth", "sym", str(victims["pth"]), 0o777),
                  ("lib/", "dir", None, 0o755), ("lib/modules/", "dir", None, 0o755),
                  ("lib/modules/forkd/", "dir", None, 0o755),
                  ("lib/modules/forkd/virtio_net.ko", "sym", str(victims["ko"]), 0o777),
                  ("etc/", "dir", None, 0o755), ("etc/hostname", "sym", str(victims["hostname"]), 0o777)])
    return _write_layout(tmp_path / "hostile", [(layer, LAYER_TAR)])


@pytest.mark.parametrize("kind", ["initramfs", "disk"])
def test_from_image_hostile_image(rt, tmp_path, kind):
    """(a) a setuid-root binary (a copy of id) in the image is never reachable by uid 65534, during the build or
    after it; (b) the .pth, a kernel module and /etc/hostname planted as symlinks to host files are replaced,
    never written through (nor read into the stage-1 initramfs of a disk image); the build tree is private."""
    layout = _public_home(rt)
    victims = {k: _victim(tmp_path, k) for k in ("pth", "ko", "hostname")}
    probes: list[tuple[str, list[Path], list[str]]] = []

    def progress(msg: str) -> None:
        trees = [t for t in sorted(layout.tmp.iterdir()) if stat.S_IMODE(t.lstat().st_mode) != 0o700]
        probes.append((msg, trees, _nobody_finds_setuid_root(layout.home)))

    try:
        image, built = container.from_image(layout, _hostile_image(tmp_path, victims), pip=("six",), progress=progress,
                                      rootfs=kind)
        assert len(probes) > 3, "the build was never probed"
        for msg, _, found in probes:
            assert found == [], f"at '{msg}' uid 65534 reached {found}"
        assert _nobody_finds_setuid_root(layout.home) == []
        for k, v in victims.items():
            assert v.read_text() == "host file, untouched\n", k
        assert b"host file, untouched" not in image.initrd.read_bytes()
        for msg, public, _ in probes:
            assert public == [], f"at '{msg}' the build tree {public} is not private (0700)"
        assert built and image.meta["unpack"]["setid_stripped"] == ["usr/bin/suidprobe"]
    finally:
        shutil.rmtree(layout.home, ignore_errors=True)


# ---------------------------------------------------------------- image sources named by specs
def test_spec_image_ref_outside_allowed_roots_refused(rt, tmp_path, monkeypatch):
    monkeypatch.delenv("FORKD_IMAGE_ROOTS", raising=False)
    for ref in ["/etc", "/etc/shadow", "/dev/zero", str(rt.layout.home / "image-sources/../../../etc"), "etc"]:
        with pytest.raises(InvalidInput, match="specs may take images from|must be an absolute path") as exc:
            core_images.ensure_image(rt, {"oci": {"ref": ref}})
        assert exc.value.hint
        with pytest.raises(InvalidInput, match="specs may take images from|must be an absolute path"):
            core_images.build_oci(rt, ref)  # what the reconciler's ForkParent handler calls
    # a symlink inside the allowed root that leads out of it
    src = rt.layout.home / "image-sources"
    src.mkdir(exist_ok=True)
    (src / "evil").unlink(missing_ok=True)
    (src / "evil").symlink_to("/etc")
    with pytest.raises(InvalidInput, match="specs may take images from") as exc:
        core_images.ensure_image(rt, {"oci": {"ref": str(src / "evil")}})
    assert "FORKD_IMAGE_ROOTS" in exc.value.hint
    # a layout anywhere else: refused for specs until the operator allows its directory
    outside = _write_layout(tmp_path / "elsewhere", [(_tar([("f", "file", b"x", 0o644)]), LAYER_TAR)])
    with pytest.raises(InvalidInput, match="specs may take images from"):
        core_images.check_spec_ref(rt, str(outside))
    monkeypatch.setenv("FORKD_IMAGE_ROOTS", f"/nonexistent:{tmp_path}")
    assert core_images.check_spec_ref(rt, str(outside)) == os.path.realpath(outside)
    with pytest.raises(InvalidInput, match="specs may take images from"):
        core_images.check_spec_ref(rt, "/etc")


def test_layout_blob_symlink_to_host_file_refused(tmp_path):
    """A layout whose layer blob is a symlink to a host file (content known to the author, so its digest
    matches) would carry that file into the guest: refused, whoever names the layout."""
    victim = tmp_path / "host" / "secret.tar"
    victim.parent.mkdir()
    victim.write_bytes(_tar([("secret", "file", b"host secret\n", 0o600)]))
    d = _write_layout(tmp_path / "img", [(victim.read_bytes(), LAYER_TAR)])
    blob = next(p for p in (d / "blobs/sha256").iterdir() if p.read_bytes() == victim.read_bytes())
    blob.unlink()
    blob.symlink_to(victim)
    with pytest.raises(oci.UnsafeImage, match="outside the image layout"):
        oci.open_source(d)


def test_debian_trim_does_not_follow_planted_symlinks(tmp_path, resolver):
    """The Debian path trims directories (usr/share/doc ...) of the rootfs: through `usr/share` planted as a
    symlink to a host directory it must not delete or recreate anything there."""
    from forkd.image import debian

    host = tmp_path / "host"
    (host / "doc").mkdir(parents=True)
    (host / "doc" / "keep").write_text("keep\n")
    (host / "perl").mkdir()
    root = tmp_path / "root"
    (root / "usr").mkdir(parents=True)
    (root / "usr/share").symlink_to(host)
    (root / "usr/lib").symlink_to("../" * 12 + str(host).lstrip("/"))  # climbs: clamped at the rootfs' top
    (host / "x86_64-linux-gnu").symlink_to(host)  # usr/lib/x86_64-linux-gnu/perl -> host/perl on the host
    debian._trim(root)
    debian._trim_perl(root, {})
    assert (host / "doc" / "keep").read_text() == "keep\n"
    assert sorted(os.listdir(host)) == ["doc", "perl", "x86_64-linux-gnu"]


def test_symlink_loop_is_a_clean_error(tmp_path, resolver):
    with pytest.raises(InvalidInput, match="does not apply over the layers below it"):
        _unpack(tmp_path / "root", [("a", "sym", "b", 0o777), ("b", "sym", "a", 0o777)], [("a/x", "file", b"1", 0o644)])
