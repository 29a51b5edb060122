#!/usr/bin/env bash
# The whole test suite from a fresh clone: makes .venv, installs the package with its test
# extras, prepares what the real-cluster tests need where this machine allows it (root on
# Debian: iproute2 for network namespaces, chromium for the board's browser tests, the local
# SLURM dev cluster), then runs pytest; then the compatibility layer (the tests marked compat) on
# each extra torch, each in a venv of its own (.venv-torch-VERSION).
# Extra arguments go to the main suite's pytest (one run, the quiet tests in it) and leave the extra torches out,
# e.g. `bash tests/run.sh -k config`.
# LAUNCHER_COMPAT_TORCH="VERSION ..." names other extra torches ("" none); LAUNCHER_TEST_MAIN=0 leaves the main suite
# and its set-up (.venv, apt-get, the SLURM dev cluster) out, to check the compatibility layer alone (CI sets neither).
set -euo pipefail
cd "$(dirname "$0")/.."

# The newest torch released and the oldest setup.cfg admits (tests/test_packaging.py holds the floor to this line).
COMPAT_TORCH="2.15.0 2.10.0"
compat_torch=${LAUNCHER_COMPAT_TORCH-$COMPAT_TORCH}
[ $# = 0 ] || compat_torch=""
main=${LAUNCHER_TEST_MAIN:-1}

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
if [ "$main" != 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  machine_log=$(mktemp)
  prepare_machine >"$machine_log" 2>&1 &
  machine=$!
fi

# Each extra torch's venv: that torch first, then the package beside it, as a user adds it to their own torch, and the
# check that pip kept that torch. The downloads (torch's CUDA build and its nvidia-* libraries, GBs) run in the
# background, niced, while .venv installs and the main suite runs: the network is idle then and the suite CPU-bound.
# PIP_CONSTRAINT=/dev/null: a machine's pip configuration may cap torch (these machines cap it at the releases on
# their disk); an extra venv takes the index's torch, and the package must keep it.
compat_venv() {
  local version=$1 venv=.venv-torch-$1 started=$SECONDS kept
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv" || return 1
  PIP_CONSTRAINT=/dev/null "$venv/bin/pip" install -q --no-compile --disable-pip-version-check "torch==$version" numpy || return 1
  PIP_CONSTRAINT=/dev/null "$venv/bin/pip" install -q --no-compile --disable-pip-version-check -e '.[compat]' || return 1
  kept=$("$venv/bin/python" -c 'import torch; print(torch.__version__)') || return 1
  if [ "${kept%%+*}" != "$version" ]; then
    echo "tests/run.sh: pip install -e . replaced torch $version with $kept in $venv"
    return 1
  fi
  echo "tests/run.sh: $venv: pip kept torch $kept beside the package; made in $((SECONDS - started)) s, $(du -sh "$venv" | cut -f1)"
}
compat_installs() {
  local version
  for version in $compat_torch; do
    if compat_venv "$version" >"$compat_log.$version" 2>&1; then
      touch "$compat_log.$version.ok"
    fi
  done
}
compat=""
if [ -n "$compat_torch" ]; then
  compat_log=$(mktemp)
  compat_started=$SECONDS
  # a process group of its own (setsid execs in place: $! leads it), so that an early exit stops its pip too
  compat_torch=$compat_torch compat_log=$compat_log \
    nice -n 10 setsid bash -c "$(declare -f compat_venv compat_installs); compat_installs" &
  compat=$!
fi

# also when pip fails below: the background set-ups are stopped (our own jobs, by their ids) and a cluster one started
# goes down
cleanup() {
  [ -z "$machine" ] || kill "$machine" 2>/dev/null || true
  [ -z "$compat" ] || kill -- "-$compat" 2>/dev/null || true
  wait 2>/dev/null || true
  if [ -n "${machine_log:-}" ]; then
    [ ! -e "$machine_log.slurm" ] || bash cluster/devcluster/down.sh >/dev/null 2>&1 || true
    rm -f "$machine_log" "$machine_log.slurm"
  fi
  [ -z "${compat_log:-}" ] || rm -f "$compat_log" "$compat_log".*
}
trap cleanup EXIT

if [ "$main" != 0 ]; then
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
fi

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
# Then the tests marked quiet, alone: each checks a timing claim about this machine (a slow rank named within 50 steps,
# none named in a uniform run), which the parallel suite's load, not the launcher, could break. With arguments, one run.
status=0
if [ "$main" != 0 ]; then
  if [ $# = 0 ]; then
    .venv/bin/python -m pytest -n "${LAUNCHER_TEST_WORKERS:-3}" --dist loadgroup --no-loadscope-reorder -m "not quiet" || status=$?
    quiet_files=$(grep -l "mark.quiet" tests/test_*.py)
    # shellcheck disable=SC2086
    .venv/bin/python -m pytest -p no:cacheprovider -m quiet $quiet_files || status=1
  else
    .venv/bin/python -m pytest -n "${LAUNCHER_TEST_WORKERS:-3}" --dist loadgroup --no-loadscope-reorder "$@" || status=$?
  fi
fi

# The compatibility layer on each extra torch, from the files that hold a compat-marked test (collecting the whole suite
# would import every test module, in each venv). A venv that could not be made, or a failing layer, fails the run.
if [ -n "$compat" ]; then
  waited=$SECONDS
  wait "$compat" || true
  compat=""
  echo "tests/run.sh: the extra torches' venvs were made $((SECONDS - compat_started)) s after the start; the layer waited $((SECONDS - waited)) s for them"
  layer_files=$(grep -l "mark.compat" tests/test_*.py)
  for version in $compat_torch; do
    cat "$compat_log.$version"
    if [ ! -e "$compat_log.$version.ok" ]; then
      echo "tests/run.sh: torch $version: its venv could not be made (above); its compatibility layer did not run"
      status=1
      continue
    fi
    started=$SECONDS
    # Python writes each module's .pyc at its first import here (PYTHONDONTWRITEBYTECODE unset for the layer alone):
    # a compileall of the venv beforehand costs ~60 CPU-s, most of it for modules the layer never imports
    # shellcheck disable=SC2086
    env -u PYTHONDONTWRITEBYTECODE ".venv-torch-$version/bin/python" -m pytest -p no:cacheprovider -m compat \
      -n "${LAUNCHER_COMPAT_WORKERS:-2}" --dist loadgroup $layer_files || status=1
    echo "tests/run.sh: the compatibility layer on torch $version took $((SECONDS - started)) s"
  done
fi
exit "$status"
