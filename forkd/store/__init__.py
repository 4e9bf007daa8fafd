"""Snapshots on disk: the manifest record, its status life cycle (writing -> ready | failed) and the
memory file helpers (sparse copy with hashing). Nothing here starts a VM."""
