#!/usr/bin/env bash
# The whole test suite from a fresh clone: makes .venv, installs the package with its test
# extras, prepares what the real-cluster tests need where this machine allows it (root on
# Debian: iproute2 for network namespaces, chromium for the board's browser tests, the local
# SLURM dev cluster), then runs pytest.
# Extra arguments go to pytest, e.g. `bash tests/run.sh -k config`.
set -euo pipefail
cd "$(dirname "$0")/.."

# The machine's part (root on Debian: apt-get, then the SLURM dev cluster's daemons) needs no Python of ours: it runs
# in the background while pip installs, and its output is shown once both are done.
machine=""
prepare_machine() {
  if ! command -v ip >/dev/null; then
    (apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null) || echo "tests/run.sh: could not install iproute2; network-namespace tests will skip"
  fi
  if ! command -v chromium >/dev/null; then
    (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "tests/run.sh: could not install chromium; the board's browser tests will skip"
  fi
  if [ -x cluster/devcluster/up.sh ] && [ "${LAUNCHER_TEST_SLURM:-1}" = 1 ]; then
    if bash cluster/devcluster/up.sh; then
      touch "$machine_log.slurm"
    else
      echo "tests/run.sh: the SLURM dev cluster did not come up; SLURM tests will skip"
    fi
  fi
}
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  machine_log=$(mktemp)
  prepare_machine >"$machine_log" 2>&1 &
  machine=$!
  # also when pip fails below: the set-up is stopped (our own job, by its id) and a cluster it started goes down
  trap '[ -z "$machine" ] || kill "$machine" 2>/dev/null || true; wait 2>/dev/null || true
        [ ! -e "$machine_log.slurm" ] || bash cluster/devcluster/down.sh >/dev/null 2>&1 || true
        rm -f "$machine_log" "$machine_log.slurm"' EXIT
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# torch is pinned to the CPU build that lies on this kind of machine (see docs/getting-started.md: GPU
# machines); the docs extra is mkdocs, for tests/test_docs.py's strict build of the documentation site.
# --no-compile, then compileall on every core: pip byte-compiles on one core only (about a minute here).
.venv/bin/pip install -q --no-compile --disable-pip-version-check torch==2.13.0 -e '.[test,docs]'
# Left out: what no test imports (no byte of their .pyc files was read in a whole run, 2026-11-27: 108 of 390 MB).
# Never leave out what is imported after all: with PYTHONDONTWRITEBYTECODE set (as it is on these machines) a module
# with no .pyc is compiled again in every process that imports it (sympy's plotting or tensor, imported with torch's
# checkpoint code, cost each zygote and each torchrun worker ~0.1 s so).
unused='/site-packages/(transformers/models/(?!auto/|gpt2/|__init__)|plotly/(validators|graph_objs|express|figure_factory)/|ray/(rllib|data|tune|train|air)/|narwhals/|cfnlint/|graphql/|prompt_toolkit/|sympy/(physics|stats|integrals/rubi|holonomic|liealgebras|categories|diffgeom|vector|crypto|codegen)/)'
.venv/bin/python -m compileall -q -j 0 -x "$unused" .venv/lib/python3*/site-packages >/dev/null 2>&1 || true  # (a test file of some package's that does not compile)
# And this checkout's own packages (installed editable: pip compiles none of them). Where PYTHONDONTWRITEBYTECODE is set,
# as on these machines, every launcher, zygote and command would otherwise compile the ~120 modules it imports again:
# 0.45-0.52 s of a launch's imports against 0.23-0.27 s with these .pyc files (2026-11-27), some 600 times a run.
.venv/bin/python -m compileall -q -j 0 launcher trainers >/dev/null 2>&1 || true

if [ -n "$machine" ]; then
  wait "$machine" || true
  machine=""
  cat "$machine_log"
  if [ -e "$machine_log.slurm" ]; then
    # shellcheck disable=SC1091
    source "${DEVCLUSTER_DIR:-/tmp/launcher-devcluster}/env.sh"
  fi
fi

# Three pytest-xdist workers on 2 cores: the shared SLURM and Ray clusters' groups run on a worker each
# (tests/conftest.py) and spend much of their time waiting on the clusters' jobs, whose processes keep the cores busy.
# Measured on fresh clones (2026-11-27, /proc/stat and process accounting): 3 workers kept both cores 180-200% busy
# and used 11% less CPU than 4 (a test's median CPU -8%: less time-slicing among its processes); pytest took 21:49
# against 23:29. 6 workers had cost 19% more CPU than 4.
# --no-loadscope-reorder: the groups start in tests/conftest.py's order (longest first), not by test count.
# LAUNCHER_TEST_WORKERS=0 runs it in one process, in order.
.venv/bin/python -m pytest -n "${LAUNCHER_TEST_WORKERS:-3}" --dist loadgroup --no-loadscope-reorder "$@"
