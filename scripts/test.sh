#!/usr/bin/env bash
# Runs every check CI runs, in tiers; a failing tier stops the run (later tiers would only take longer to say so):
#   1. lint:  import-linter (layer order), ruff
#   2. fast:  every test that boots no VM (-m "not vm and not bench and not long"), on FORKD_TEST_WORKERS
#             pytest-xdist workers (default 4: most of these wait on subprocesses and daemons, not on a CPU); the
#             docs site is built here, strictly (tests/test_docs_site.py: mkdocs build --strict, warnings counted)
#   3. vm:    the tests that boot QEMU (-m "vm and not long"), on FORKD_VM_WORKERS workers (default 2: one per
#             core; 0 runs them in one process; each worker builds its own base snapshot,
#             bench/reports/*-ci-tiers.md); the benchmark scripts' short modes (marked bench) are collected last
#             (tests/markers.py), so the workers take them last, as the other modules run out: they check that
#             each script runs and reports every figure, not how fast
# In each tier the tests marked `serial` (they swap off host-wide state: the zram swap of tests/swap.py) run alone
# after the others. Workers take whole modules (--dist loadfile), so a module fixture is set up once and torn down
# before the next; a run gets a short --basetemp (tests/basetemp.py: a daemon's socket fits beneath tmp_path).
# Markers (what a test boots) are declared in pyproject.toml and checked in tests/markers.py.
#   scripts/test.sh           the default tiers above (what .ci/run and the README run)
#   scripts/test.sh --long    the default tiers, then the long tier (-m long: minutes each even when right)
#   scripts/test.sh ARGS...   one pytest run with ARGS (a file, -k, -m, -n 2 ...), after the lint tier
# Each pytest run prints its 25 slowest steps (--durations=25). FORKD_TEST_WORKERS=0 runs a tier in one process.
# Needs scripts/setup.sh --dev first.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
# Bytecode caches on, whatever the environment says: with PYTHONDONTWRITEBYTECODE set, every pytest process would
# rewrite the assertions of every test module again and every daemon and CLI a test starts compile forkd again.
unset PYTHONDONTWRITEBYTECODE
PYTEST=(python -m pytest -q -ra --durations=25)

echo "== tier 1: import-linter (layer order)"
lint-imports
echo "== tier 1: ruff"
ruff check forkd tests bench

long=0
if [[ "${1:-}" == "--long" ]]; then
  long=1
  shift
fi
if (($#)); then
  echo "== pytest $*"
  exec "${PYTEST[@]}" "$@"
fi
tier() {  # tier WORKERS MARKERS: the tests of MARKERS on WORKERS workers, then those of them marked serial alone
  local rc=0
  if (($1 == 0)); then
    "${PYTEST[@]}" -m "$2"
    return
  fi
  "${PYTEST[@]}" -n "$1" --dist loadfile --no-loadscope-reorder -m "($2) and not serial" || rc=$?
  ((rc == 0 || rc == 5)) || return "$rc"  # 5: nothing selected
  "${PYTEST[@]}" -m "($2) and serial" || rc=$?
  ((rc == 0 || rc == 5)) || return "$rc"
}
echo "== tier 2: tests that boot no VM"
tier "${FORKD_TEST_WORKERS:-4}" "not vm and not bench and not long"
echo "== tier 3: tests that boot VMs, then the benchmark smoke"
tier "${FORKD_VM_WORKERS:-2}" "(vm or bench) and not long"
if ((long)); then
  echo "== long tier"
  "${PYTEST[@]}" -m long
fi
