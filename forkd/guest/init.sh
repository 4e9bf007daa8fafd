#!/bin/sh
# forkd guest init (busybox sh). Mounts the basics, loads the virtio modules (Debian's cloud kernel builds
# them as modules; on a disk-backed image boot.sh loaded some already), then hands PID 1 to the Python agent. With `forkd.probe` on the kernel command line it
# only proves that the guest boots (the accelerator probe) and powers off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
case " $(cat /proc/cmdline) " in
  *" forkd.probe "*) echo "FORKD-PROBE-OK"; poweroff -f ;;
esac
load() { [ -d /sys/module/$1 ] || insmod /lib/modules/forkd/$1.ko || echo "forkd-init: insmod $1 failed"; }
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_console; do load $m; done
ip link set lo up 2>/dev/null
# forkd.net=1 (a parent built with network: isolated): the NIC gets the fixed guest address every clone keeps.
# Its gateway 10.42.0.1 is the tap inside each child's own network namespace. Nothing in the guest listens.
case " $(cat /proc/cmdline) " in
  *" forkd.net=1 "*)
    for m in failover net_failover virtio_net; do load $m; done
    ip link set eth0 up && ip addr add 10.42.0.2/24 dev eth0 && ip route add default via 10.42.0.1 \
      || echo "forkd-init: eth0 configuration failed"
    ;;
esac
hostname forkd
cd /
exec /usr/bin/python3.11 -E -s /forkd/agent.py
