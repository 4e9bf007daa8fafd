#!/usr/bin/env bash
# Builds the node image (the daemon and the operator) from Debian packages and this tree, with no registry:
#   1. a base: `mmdebstrap` of the packages in deploy/kubernetes/image/packages.txt, `podman import`ed as
#      localhost/forkd-base:<hash of that list and the suite> (cached: built once per package list);
#   2. wheels of forkd-client (sdk/python) and forkd, built here by pip (forkd-client is not on the package index:
#      it is this repository's sdk/python);
#   3. `podman build` of deploy/kubernetes/Dockerfile FROM that base, installing the wheels offline into /opt/forkd.
# Usage: scripts/build-image.sh [TAG]        TAG defaults to localhost/forkd:dev
# Needs root, podman with runc (crun refuses hybrid cgroup hosts), mmdebstrap and a Debian mirror
# (FORKD_DEBIAN_MIRROR, default the host's). The image's tag is printed on the last line of stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

tag="${1:-localhost/forkd:dev}"
suite="${FORKD_IMAGE_SUITE:-bookworm}"
mirror="${FORKD_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
runtime="${FORKD_OCI_RUNTIME:-$(command -v runc || true)}"
for tool in podman mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "build-image: $tool is not installed (apt-get install $tool)" >&2; exit 2; }
done
[ -n "$runtime" ] || { echo "build-image: runc is not installed (apt-get install runc)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "build-image: run as root (mmdebstrap and podman's storage)" >&2; exit 2; }

pkgs="$(grep -v '^#' deploy/kubernetes/image/packages.txt | tr -s ' \n' ',' | sed 's/^,//; s/,$//')"
base="localhost/forkd-base:$(printf '%s|%s|%s' "$suite" "$mirror" "$pkgs" | sha256sum | cut -c1-16)"
work="$(mktemp -d /var/tmp/forkd-image.XXXXXX)"
trap 'rm -rf "$work"' EXIT

if ! podman image exists "$base"; then
  echo "build-image: base $base: mmdebstrap $suite + $pkgs" >&2
  # apt lists are kept: the init container's `forkd image build` resolves the guest's packages with apt
  mmdebstrap --variant=minbase --include="$pkgs" --aptopt='APT::Install-Recommends "false"' \
    --skip=cleanup/apt/lists "$suite" "$work/base.tar" "$mirror" >&2
  podman import --change 'CMD ["/bin/bash"]' "$work/base.tar" "$base" >&2
  rm -f "$work/base.tar"
fi

echo "build-image: wheels of forkd-client and forkd" >&2
.venv/bin/python -m pip wheel -q --disable-pip-version-check -w "$work/wheels" ./sdk/python . >&2 \
  || python3 -m pip wheel -q --disable-pip-version-check -w "$work/wheels" ./sdk/python . >&2
mkdir -p "$work/ctx"
mv "$work/wheels" "$work/ctx/wheels"
cp deploy/kubernetes/image/packages.txt "$work/ctx/"

echo "build-image: podman build $tag FROM $base" >&2
podman --runtime "$runtime" build --network host --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
  --build-arg "BASE=$base" -f deploy/kubernetes/Dockerfile -t "$tag" "$work/ctx" >&2
echo "$tag"
