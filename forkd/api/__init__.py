"""The daemon and its HTTP API (`forkd serve`). Run as `python -m forkd.api serve ...`."""
