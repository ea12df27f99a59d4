#!/usr/bin/env bash
# Mutation testing of the core (tests/mutation/README.md): mutmut over the files
# [tool.mutmut] in pyproject.toml lists, against the unit tier, then tests/mutation/REPORT.md.
#   bash tests/mutation/run.sh                 everything, from scratch (README.md here gives the time)
#   bash tests/mutation/run.sh "models.states*"  only these mutants (mutmut's name globs)
# The whole run starts from scratch (mutants/ is mutmut's copy of the code and its results);
# a run with names keeps mutants/ and re-tests just those, e.g. after adding a test.
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV="${FL_VENV:-.venv}"
if [ ! -x "$VENV/bin/mutmut" ]; then
  echo "mutmut is missing: install the dev extra (tests/README.md \"Tests\")" >&2
  exit 1
fi
# A mutant is tested by every unit test that calls its function. The simulation sweep calls
# nearly everything and runs its seeds in a module fixture (seconds that mutmut's estimates
# do not see) for every mutant, so it is left out (SIM_SEEDS=0); the simulation's harness
# tests, which run whole worlds too, stay.
export SIM_SEEDS="${SIM_SEEDS:-0}"
export SIM_WORKERS=1  # in-process: mutmut only sees calls made in its own process
export PATH="$(cd "$VENV/bin" && pwd):$PATH"  # mypy, for type_check_command (pyproject.toml)
start=$(date +%s)
load_start=$(cut -d' ' -f1 /proc/loadavg)
if [ "$#" -eq 0 ]; then rm -rf mutants; fi
"$VENV/bin/mutmut" run --max-children "$(nproc)" "$@" | tr '\r' '\n' | grep -v '^⠋\|^⠙\|^⠹\|^⠸\|^⠼\|^⠴\|^⠦\|^⠧\|^⠇\|^⠏' || true
wall=$(( $(date +%s) - start ))
# CPU seconds (user + system) of mutmut and every process it started: with the wall time and
# the load average, whether a slow run was the code's or a busy machine's.
# (`times` in this shell: in a pipe or $(...) it would report a subshell's, which is nothing.)
times > mutants/.times
cpu=$(tail -1 mutants/.times | awk '{ s = 0; for (i = 1; i <= 2; i++) { split($i, p, /[ms]/); s += p[1] * 60 + p[2] } printf "%.0f", s }')
summary="$wall s wall, $cpu CPU-s (user + system) on $(nproc) cores, load average $load_start at the start and $(cut -d' ' -f1 /proc/loadavg) at the end ($(date -u '+%Y-%m-%d %H:%M UTC'))"
echo "mutmut: $summary"
# A run from scratch leaves its figures for the report (a run with names keeps them).
if [ "$#" -eq 0 ]; then echo "$summary" > mutants/last-full-run.txt; fi
"$VENV/bin/python" -m tests.mutation.report
