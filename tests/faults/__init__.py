"""Faults that are not kill -9, each injected for real (see docs/faults.md)."""
