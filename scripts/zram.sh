#!/usr/bin/env bash
# The zram swap forkd's defaults assume: idle children are paged out to it and put to sleep (FORKD_IDLE_PAGEOUT_SECS,
# FORKD_IDLE_SLEEP; docs/density.md). zram is compressed RAM: nothing reaches a disk, and it is gone at power-off.
#
# Usage (as root):
#   scripts/zram.sh up [--size BYTES]   make one if the host has no swap at all (does nothing when it has some);
#                                       size: twice this host's memory (what it holds uncompressed), its compressed
#                                       pages capped at half the host's memory (zram's mem_limit)
#   scripts/zram.sh down                remove the one `up` made (recorded in $FORKD_RUN_DIR/zram-swap), nothing else
#   scripts/zram.sh status              what swap there is, and whether `up` made it
# A zram device does not survive a reboot: run `up` again after one (`forkd doctor` says when it is missing).
# Exit codes: 0 done, or nothing to do, or zram cannot be had on this host (said on stderr: the host goes on
# without page-out); 1 a step failed (whatever was made is removed); 2 bad usage.
set -Eeuo pipefail  # -E: the ERR trap of `up` holds inside the functions it calls

SYS=${FORKD_ZRAM_SYSFS:-/sys}          # where sysfs is (tests point it at an empty directory: no zram there)
STATE_DIR=${FORKD_RUN_DIR:-/run/forkd}
STATE=$STATE_DIR/zram-swap             # "DEVICE DISKSIZE" of the device `up` made
CONTROL=$SYS/class/zram-control

say() { echo "zram: $*"; }
warn() { echo "zram: warning: $*" >&2; }
die() { echo "zram: error: $*" >&2; exit 1; }
usage() { sed -n '4,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

swaps() { awk 'NR > 1 { print $1 }' /proc/swaps 2>/dev/null || true; }
mem_kib() { awk '$1 == "MemTotal:" { print $2 }' /proc/meminfo; }

up() {
  local size=$1 have other id dev blk limit
  have=$(swaps)
  if [ -n "$have" ]; then
    other=$(echo "$have" | grep -v '^/dev/zram' || true)
    if [ -z "$other" ]; then
      say "the host has a zram swap already ($(echo "$have" | tr '\n' ' ' | sed 's/ $//')): nothing to do"
    else
      warn "the host's swap $(echo "$other" | tr '\n' ' ')is not zram: forkd pages idle children out only when" \
        "every swap is zram (FORKD_IDLE_PAGEOUT_DISK=1 allows a disk: SECURITY.md section 9); no zram swap added"
    fi
    return 0
  fi
  if [ ! -e "$CONTROL/hot_add" ]; then
    modprobe zram num_devices=0 >/dev/null 2>&1 || true
  fi
  if [ ! -e "$CONTROL/hot_add" ]; then
    warn "zram cannot be loaded on this host (no $CONTROL after modprobe zram): idle children will not be paged" \
      "out (forkd doctor: idle-pageout); going on without it"
    return 0
  fi
  [ -n "$size" ] || size=$(( $(mem_kib) * 2 * 1024 ))
  limit=$(( $(mem_kib) / 2 * 1024 ))
  id=$(cat "$CONTROL/hot_add")
  dev=/dev/zram$id
  blk=$SYS/block/zram$id
  trap 'undo_made "$id" "$dev"' ERR
  if grep -qw lz4 "$blk/comp_algorithm"; then echo lz4 > "$blk/comp_algorithm"; fi
  echo "$size" > "$blk/disksize"
  echo "$limit" > "$blk/mem_limit"
  wait_node "$dev"
  mkswap -L forkd-zram "$dev" >/dev/null
  swapon --priority 100 "$dev"
  mkdir -p "$STATE_DIR"
  echo "$dev $size" > "$STATE.tmp"
  mv "$STATE.tmp" "$STATE"
  trap - ERR
  say "made $dev a swap of $(( size >> 20 )) MiB ($(cat "$blk/comp_algorithm" | grep -o '\[[a-z0-9-]*\]'))," \
    "its compressed pages at most $(( limit >> 20 )) MiB; 'scripts/setup.sh --undo-zram' removes it"
}

wait_node() {  # the device node appears once the kernel announced the device (devtmpfs, or udev)
  local i
  for i in $(seq 50); do [ -b "$1" ] && return 0; sleep 0.1; done
  warn "$1 did not appear"
  return 1
}

undo_made() {  # a step of `up` failed: remove the device it added, leave nothing half-made
  warn "could not make $2 a swap: removing it"
  swapoff "$2" >/dev/null 2>&1 || true
  echo 1 > "$SYS/block/zram$1/reset" 2>/dev/null || true
  echo "$1" > "$CONTROL/hot_remove" 2>/dev/null || true
  rm -f "$STATE.tmp"
  exit 1
}

down() {
  local dev size id blk
  if [ ! -f "$STATE" ]; then
    say "no zram swap made by scripts/zram.sh on this host since its last boot: nothing to undo"
    return 0
  fi
  read -r dev size < "$STATE" || true
  id=${dev#/dev/zram}
  case "$id" in ''|*[!0-9]*) die "$STATE does not name a zram device ($dev): remove it by hand";; esac
  blk=$SYS/block/zram$id
  if [ ! -e "$blk/disksize" ] || [ "$(cat "$blk/disksize")" != "$size" ]; then
    warn "$dev is not the device zram.sh made (gone, or made again since): left alone"
    rm -f "$STATE"
    return 0
  fi
  if swaps | grep -qx "$dev"; then
    swapoff "$dev" || die "swapoff $dev failed (the pages in it need that much free memory): nothing removed"
  fi
  echo 1 > "$blk/reset"
  echo "$id" > "$CONTROL/hot_remove" 2>/dev/null || true  # a device the module made at load stays, reset
  rm -f "$STATE"
  say "removed $dev"
}

status() {
  local have
  have=$(swaps)
  say "swap: $(echo "${have:-none}" | tr '\n' ' ')"
  if [ -f "$STATE" ]; then say "made by scripts/zram.sh: $(cut -d' ' -f1 "$STATE")"; fi
}

[ "$(id -u)" = 0 ] || { echo "zram.sh: run as root (it adds a swap device)" >&2; exit 1; }
cmd=${1:-}
shift || true
size=""
while [ $# -gt 0 ]; do
  case "$1" in
    --size) [ $# -ge 2 ] || usage; size=$2; shift 2;;
    *) usage;;
  esac
done
case "$size" in ''|*[!0-9]*) [ -z "$size" ] || { echo "zram.sh: --size takes bytes, e.g. 4294967296" >&2; exit 2; };;
esac
case "$cmd" in
  up) up "$size";;
  down) down;;
  status) status;;
  *) usage;;
esac
