"""The VMM driver (QEMU; a Firecracker driver would implement the same contract, see CONTRACT.md), the QMP
client, the accelerator probe and the guest-agent client. Knows nothing of specs, pools or the store: it boots,
saves and restores machines."""
