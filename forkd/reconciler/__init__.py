"""Reconciler: plan(desired, actual) -> actions, an executor and a loop."""
