"""VMM drivers (QEMU now; Firecracker where installed), the QMP client, the accelerator probe and the
guest-agent client. Knows nothing of specs, pools or the store: it boots, saves and restores machines."""
