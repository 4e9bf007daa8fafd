#!/bin/busybox sh
# forkd stage-1 init for disk-backed images (busybox sh, from a small initramfs). Loads the virtio modules, mounts
# the root disk (/dev/vda: ext4, built into Debian's cloud kernel) and hands PID 1 to the image's own /init
# (forkd's init.sh). With `forkd.probe` on the kernel command line it only proves the guest boots (no disk).
BB=/bin/busybox
$BB mkdir -p /proc /sys /dev /newroot
$BB mount -t proc proc /proc
$BB mount -t sysfs sysfs /sys
$BB mount -t devtmpfs devtmpfs /dev
case " $($BB cat /proc/cmdline) " in
  *" forkd.probe "*) echo "FORKD-PROBE-OK"; $BB poweroff -f ;;
esac
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_blk; do
  $BB insmod /lib/modules/forkd/$m.ko || echo "forkd-boot: insmod $m failed"
done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 500 ]; do $BB usleep 10000; i=$((i + 1)); done
if ! $BB mount -t ext4 -o noatime /dev/vda /newroot; then
  echo "forkd-boot: cannot mount the root disk /dev/vda"; $BB poweroff -f
fi
$BB umount /proc /sys /dev
exec $BB switch_root /newroot /init
