#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine, run as root:
#   Debian packages (QEMU, busybox, cpio, ...), kernel settings, a zram swap sized for the machine (what the idle
#   page-out and sleep defaults assume: scripts/zram.sh), a virtualenv in .venv with forkd installed,
#   the default guest image (Debian's cloud kernel + busybox + Python 3.11 + the forkd agent), then `forkd doctor`
#   (a check of this host; its accelerator probe, one guest boot, is cached for the builds after it).
# Usage: scripts/setup.sh [--dev] [--no-zram]
#        scripts/setup.sh --undo-zram
#   --dev        also install the test and lint tools
#   --no-zram    make no zram swap (idle children then keep all their memory: forkd doctor, idle-pageout)
#   --undo-zram  only remove the zram swap an earlier run made (nothing else), then stop
# A host where zram cannot be loaded gets a warning and the rest of the set-up.
set -euo pipefail
cd "$(dirname "$0")/.."

extra="" zram=1
for arg in "$@"; do
  case "$arg" in
    --dev) extra="[dev]";;
    --no-zram) zram="";;
    --undo-zram) zram="undo";;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0;;
    *) echo "setup.sh: unknown option $arg (see scripts/setup.sh --help)" >&2; exit 2;;
  esac
done
if [ "$(id -u)" != 0 ]; then echo "setup.sh: run as root (it installs Debian packages)" >&2; exit 1; fi
if [ "$zram" = undo ]; then exec scripts/zram.sh down; fi

pkgs="qemu-system-x86 qemu-utils busybox-static cpio python3 python3-venv python3.11-minimal libpython3.11-stdlib \
iproute2 util-linux ca-certificates nftables mmdebstrap skopeo"
# the TypeScript SDK's tests run under node --test; registry pulls are tested against docker-registry on loopback
# (htpasswd from apache2-utils, a self-signed certificate from openssl)
if [ -n "$extra" ]; then pkgs="$pkgs nodejs docker-registry apache2-utils openssl"; fi
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
if [ -n "$extra" ] && command -v systemctl >/dev/null; then
  # Debian starts the packaged registry on every address, port 5000: the tests run their own on loopback
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi

# Kernel settings forkd's security posture relies on (forkd doctor checks them; SECURITY.md, "VMM privileges"):
# VMMs drop root by default (FORKD_VMM_RUNAS=per-child), and QEMU 7.2's background snapshot (live branch) then needs
# userfaultfd without CAP_SYS_PTRACE; symlink and hard-link protection keeps root from following a user's links
# in shared sticky directories such as /dev/shm.
echo "setup: kernel settings in /etc/sysctl.d/60-forkd.conf"
cat > /etc/sysctl.d/60-forkd.conf <<'CONF'
# forkd (scripts/setup.sh): see SECURITY.md
vm.unprivileged_userfaultfd = 1
fs.protected_symlinks = 1
fs.protected_hardlinks = 1
CONF
sysctl -q -p /etc/sysctl.d/60-forkd.conf || echo "setup: warning: could not apply /etc/sysctl.d/60-forkd.conf now" >&2

if [ -n "$zram" ]; then
  echo "setup: a zram swap for idle children (scripts/zram.sh up; --no-zram skips it)"
  scripts/zram.sh up || echo "setup: warning: no zram swap (scripts/zram.sh up failed, above): idle children will" \
    "not be paged out; going on" >&2
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
echo "setup: installing forkd-client (sdk/python) and forkd${extra} into .venv"
# the runtime depends on the light client (forkd-client, import forkd_client: its errors and SDK), which is not on
# PyPI: both are installed from this tree in one resolution. uv (from PyPI, into .venv) installs them in a fraction of
# pip's CPU time; where it cannot be installed, pip does it (the client first, so pip finds it installed).
if .venv/bin/pip install -q --disable-pip-version-check uv && [ -x .venv/bin/uv ]; then
  .venv/bin/uv pip install -q --python .venv/bin/python -e sdk/python -e ".${extra}"
else
  echo "setup: no uv (pip install uv failed): installing with pip" >&2
  .venv/bin/pip install -q --disable-pip-version-check -e sdk/python
  .venv/bin/pip install -q --disable-pip-version-check -e ".${extra}"
fi

echo "setup: building the default guest image (cached after the first time)"
.venv/bin/forkd image build
echo "setup: checking this host (forkd doctor; its KVM probe boots a guest once, cached for later builds)"
.venv/bin/forkd doctor || echo "setup: warning: forkd doctor found a failing check (above): forkd may not work here" >&2
