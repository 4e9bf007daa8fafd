"""Helpers the benchmarks in bench/ share (bench/*.py are the scripts; these are modules, not run on their own)."""
