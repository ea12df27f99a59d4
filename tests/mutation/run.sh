#!/usr/bin/env bash
# Mutation testing of the core (README "Tests", Mutation testing): mutmut over the files
# [tool.mutmut] in pyproject.toml lists, against the unit tier, then tests/mutation/REPORT.md.
#   bash tests/mutation/run.sh                 everything (about 20 minutes on 2 idle cores)
#   bash tests/mutation/run.sh "models.states*"  only these mutants (mutmut's name globs)
# The whole run starts from scratch (mutants/ is mutmut's copy of the code and its results);
# a run with names keeps mutants/ and re-tests just those, e.g. after adding a test.
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV="${FL_VENV:-.venv}"
if [ ! -x "$VENV/bin/mutmut" ]; then
  echo "mutmut is missing: install the dev extra (README \"Tests\")" >&2
  exit 1
fi
# A mutant is tested by every unit test that calls its function. The simulation sweep calls
# nearly everything and runs its seeds in a module fixture (seconds that mutmut's estimates
# do not see) for every mutant, so it is left out (SIM_SEEDS=0); the simulation's harness
# tests, which run whole worlds too, stay.
export SIM_SEEDS="${SIM_SEEDS:-0}"
export SIM_WORKERS=1  # in-process: mutmut only sees calls made in its own process
start=$(date +%s)
if [ "$#" -eq 0 ]; then rm -rf mutants; fi
"$VENV/bin/mutmut" run "$@" | tr '\r' '\n' | grep -v '^⠋\|^⠙\|^⠹\|^⠸\|^⠼\|^⠴\|^⠦\|^⠧\|^⠇\|^⠏' || true
echo "mutmut: $(( $(date +%s) - start )) s"
"$VENV/bin/python" -m tests.mutation.report
