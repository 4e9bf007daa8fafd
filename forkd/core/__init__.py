"""The runtime core that front ends call: it combines images, the snapshot store, the child supervisor and
the VMM driver into operations (create a snapshot, fork children, exec, kill, doctor)."""
