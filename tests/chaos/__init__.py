"""The crash harness (issue 15): `python -m tests.chaos --kills 50 --seed 7` for the full form; test_chaos.py runs
a reduced form in CI. See harness.py for a round, invariants.py for what is checked after every restart."""
