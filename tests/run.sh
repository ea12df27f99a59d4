#!/usr/bin/env bash
# The test command (README "The two commands"; .ci/run calls exactly this).
#   bash tests/run.sh              everything: lint, types, unit, integration, e2e
#   bash tests/run.sh -m unit      one tier: -m unit | -m integration | -m e2e | -m containers
#                                  (tests/README.md "Tests"); -m 'not containers' needs no container engine
#   bash tests/run.sh ARGS...      any other pytest arguments, e.g. a path or -k
# Sets up what it needs on a fresh machine: a virtualenv with the project and its dev
# extras, the PostgreSQL and Redis servers the integration and e2e tiers talk to, promtool
# and chromium, and the container engine of the containers tier (podman, on Debian as root).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${FL_VENV:-.venv}"
# Every package comes from .ci/requirements.lock (tests/README.md "Dependencies"), each file checked
# against the hash it was locked with, so every machine and CI run tests the same set; then
# the project itself, whose dependencies are all in the lock. pip installs uv alone (its
# locked version and hashes), and uv the rest: a fresh virtualenv in seconds from uv's cache,
# where pip took about a minute of CPU. Compiled to bytecode at install, as pip does: where
# PYTHONDONTWRITEBYTECODE is set (this CI machine), nothing else ever writes it, and every
# worker, server and site process compiled its imports again (a clean-clone run took 13 min
# 7 s without it, 10 min 57 s with it).
if [ ! -x "$VENV/bin/fl-dispatcher" ] || [ pyproject.toml -nt "$VENV/.installed" ] \
  || [ .ci/requirements.lock -nt "$VENV/.installed" ]; then
  echo "== installing into $VENV"
  python3 -m venv "$VENV"
  awk '/^uv==/ { on = 1 } on { print; if ($0 !~ /\\$/) exit }' .ci/requirements.lock \
    > "$VENV/uv.lock.txt"
  "$VENV/bin/python" -m pip install --quiet --no-deps --require-hashes -r "$VENV/uv.lock.txt"
  uv_install=("$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python")
  "${uv_install[@]}" --compile-bytecode --require-hashes -r .ci/requirements.lock
  "${uv_install[@]}" --no-deps -e .
  touch "$VENV/.installed"
fi
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac  # FL_VENV may be absolute
PATH="$VENV/bin:$PATH"

echo "== services"
# PostgreSQL and Redis for everything but the unit tier. Missing, the whole suite stops here
# (it would fail by the hundred); a chosen selection goes on, as it may not need them.
bash tests/tools/services.sh || [ "$#" -gt 0 ] || exit 1

echo "== tools"
# promtool runs the alert rules' tests, chromium takes the nets page's screenshot: Debian's
# packages (prometheus brings promtool), installed once where missing.
missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium fonts-dejavu-core)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    # Their tests fail naming what is missing; everything else runs.
    echo "WARNING: install promtool (Prometheus) and chromium yourself: the alert rules' test" \
      "and the nets page's browser test need them (Debian packages: ${missing[*]})" >&2
  fi
fi

echo "== container engine"
# The containers tier (tests/containers, tests/README.md "Tests") runs real containers: podman (its
# Docker-compatible API service, which each test starts on a socket of its own, and its CLI
# under podman-compose), runc, mmdebstrap (base images built from Debian packages, as no image
# registry is reachable), a static busybox (the driver tests' image) and HAProxy (the shipped
# least-privilege socket proxy, app/policies/docker-socket-proxy.haproxy.cfg, is tested).
if ! command -v podman >/dev/null || ! command -v runc >/dev/null \
  || ! command -v mmdebstrap >/dev/null || [ ! -x /bin/busybox ] \
  || ! command -v haproxy >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing podman, runc, mmdebstrap, busybox-static, haproxy"
    packages=(podman runc mmdebstrap busybox-static haproxy)
    apt-get install -y -q "${packages[@]}" >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && apt-get install -y -q "${packages[@]}" >/dev/null; }
  else
    # The other tiers do not need it; the containers tier fails, naming what is missing.
    echo "WARNING: the containers tier needs podman 4 (or Docker with compose), runc," \
      "mmdebstrap, busybox-static and haproxy; this is not a Debian machine run as root, so install" \
      "them yourself, or leave the tier out: bash tests/run.sh -m 'not containers'" >&2
  fi
fi
# No container starts without this where the container may not raise its limits ("error
# setting rlimit"); runc, not crun: crun refuses a hybrid cgroup v1/v2 host. Written only
# where no containers.conf exists yet, never over an operator's.
if command -v podman >/dev/null && [ ! -e /etc/containers/containers.conf ] \
  && [ "$(id -u)" = 0 ]; then
  mkdir -p /etc/containers
  printf '%s\n' '# Written by fl-dispatcher tests/run.sh.' '[containers]' 'default_ulimits = []' \
    '' '[engine]' 'runtime = "runc"' > /etc/containers/containers.conf
fi

echo "== leftovers"
# What a killed test run left behind (its processes, containers, databases and folders, found
# by the id each run gives them; tests/README.md "Tests"), never what a live run or anyone else owns.
# Every pytest session does this too; here it also asks podman about every labelled container.
python -m tests.fixtures.testrun || true
# SIGTERM or Ctrl-C of this script: pytest gets SIGTERM, on which it removes everything its
# run started, and anything still left is cleared. (pytest runs in the background, as bash
# runs a trap only once its foreground command has ended; a background command ignores
# Ctrl-C, so only this trap reaches it.)
pytest_pid=""
unit_pid_file=""  # the unit tier's pytest, run beside the rest (below)
stop_tests() {
  trap - TERM INT
  if [ -n "$unit_pid_file" ] && [ -s "$unit_pid_file" ]; then
    kill -TERM "$(cat "$unit_pid_file")" 2>/dev/null || true
  fi
  if [ -n "$pytest_pid" ]; then
    kill -TERM "$pytest_pid" 2>/dev/null || true
    wait "$pytest_pid" || true
  fi
  wait || true  # the unit tier's pytest too, which removes what its run started
  python -m tests.fixtures.testrun || true
  exit "$1"
}
trap 'stop_tests 143' TERM
trap 'stop_tests 130' INT
run_pytest() {
  local code=0
  python -m pytest "$@" <&0 &  # the terminal's input still (--pdb), not /dev/null
  pytest_pid=$!
  wait "$pytest_pid" || code=$?
  pytest_pid=""
  return "$code"
}

echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy"
mypy app tasks models migrations tests/sim
if [ "$#" -gt 0 ]; then
  echo "== pytest $*"
  code=0
  run_pytest "$@" || code=$?
  exit "$code"
fi

# The whole suite (pytest-xdist; each test already owns its ports, databases, Redis servers
# and folders, and a file stays on one worker, so its module fixtures are made once): the unit
# tier and everything that runs real servers at the same time, the unit tier niced. The real
# tiers mostly wait on real servers (about 1.2 cores of CPU over their run on two cores), so
# the unit tier (CPU-bound, about 230 CPU-s) runs in what they leave idle; at nice 10 it takes
# about a tenth of a core from them when both cores are wanted (their timed waits stay
# theirs), and is not starved outright (nice 19's share, about 1.5%, would stretch the unit
# tests' own few wall-clock bounds, 1-5 s). Run before them, as until round 9, it added its
# two minutes to every run. Its report is printed as it ends, a few minutes in. Workers: FL_TEST_WORKERS_UNIT (default 2)
# and FL_TEST_WORKERS (default 4: four files at a time fit two cores; six once hung NVFLARE
# logins in nvflare's own session close, bounded since, and timed tests missed their bounds).
# Which file goes to which worker: tests/tools/schedule.py (the slow modules first).
REPORTS="$(mktemp -d)"
trap 'rm -rf "$REPORTS"' EXIT
status=0
# CPU seconds (user + system) this shell's children have used so far: pytest, its workers and
# every process they started and reaped (servers a test daemonised, PostgreSQL's own, are not
# counted). `times` must run in this shell: in $(...) it would report a subshell's.
children_cpu() {
  times > "$REPORTS/times"
  tail -1 "$REPORTS/times" | awk '{ s = 0; for (i = 1; i <= 2; i++) {
    split($i, p, /[ms]/); s += p[1] * 60 + p[2] } printf "%.0f", s }' > "$REPORTS/cpu"
  cpu=$(cat "$REPORTS/cpu")
}
xdist() {  # pytest-xdist's arguments for $1 workers
  if [ "$1" -gt 1 ]; then echo -n "-n $1 --dist loadfile"; fi
}
# Each tier collects only its own folders: importing the other tier's modules in every
# worker costs seconds of CPU each (the markers still select, should a test sit elsewhere).
# The unit tier's simulation sweep (marker `sweep`, CPU-bound, 2 processes of its own) runs
# with the real tiers, unniced (tests/unit/test_simulation.py).
others=()
for path in tests/*/ tests/test_*.py; do
  case "$path" in tests/unit/ | "tests/test_*.py") ;; *) others+=("${path%/}") ;; esac
done
started=$SECONDS
children_cpu; cpu_start=$cpu
unit_workers="${FL_TEST_WORKERS_UNIT:-2}"
echo "== pytest: unit ($unit_workers workers, nice 10, beside the rest; its report as it ends)"
unit_pid_file="$REPORTS/unit.pid"
(
  begun=$(date +%s)
  # shellcheck disable=SC2046  # xdist's words
  nice -n 10 python -m pytest $(xdist "$unit_workers") --junitxml="$REPORTS/unit.xml" -q \
    -m "unit and not sweep" tests/unit > "$REPORTS/unit.log" 2>&1 < /dev/null &
  echo $! > "$unit_pid_file"
  code=0
  wait $! || code=$?
  echo "$code" > "$REPORTS/unit.rc"
  echo
  echo "== unit: $(($(date +%s) - begun)) s wall, exit $code"
  # Its report without the progress dots: failures, warnings, the summary line.
  grep -v -E '^[.FEsxX]+ *(\[ *[0-9]+%\])?$' "$REPORTS/unit.log" || true
) &
unit_job=$!
workers="${FL_TEST_WORKERS:-4}"
echo "== pytest: others ($workers workers)"
# shellcheck disable=SC2046
run_pytest $(xdist "$workers") --junitxml="$REPORTS/others.xml" -q -m "not unit or sweep" \
  "${others[@]}" tests/unit/test_simulation.py || status=$?
echo "== others: $((SECONDS - started)) s wall"
wait "$unit_job" || true
unit_code=$(cat "$REPORTS/unit.rc" 2>/dev/null || echo 1)
if [ "$unit_code" != 0 ]; then status=$unit_code; fi
# One figure for both tiers: bash reaps the unit tier's subshell whenever it ends, so its CPU
# joins the count then, not at a point this script chooses.
children_cpu
echo "== all tests: $((SECONDS - started)) s wall, $((cpu - cpu_start)) CPU-s (both tiers)"
python -m tests.tools.test_report "$REPORTS"/*.xml
exit "$status"
