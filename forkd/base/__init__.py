"""Lowest layer: pure helpers every other layer may use (paths, atomic files, errors, names, processes)."""
