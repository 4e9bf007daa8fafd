#!/usr/bin/env bash
# Runs every check CI runs: the layer contract, the linter, and the test suite (real VMs).
# Needs scripts/setup.sh --dev first.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
echo "== import-linter (layer order)"
lint-imports
echo "== ruff"
ruff check forkd tests bench
echo "== pytest"
python -m pytest -q -ra "$@"
