"""One contract, every place a job can run: what a user checks, the same wherever the job ran.

In the spirit of Hydra's LauncherTestSuite: each test states one promise of the docs and runs
for every backend. The launcher is a black box here, driven through `python -m launcher` only
(no launcher module is imported), so the suite holds whatever the code inside looks like.

Backends (each a 2-worker job, WORLD_SIZE 2):
  local       `--gpus 2`: one node, torch's elastic agent, 2 CPU workers with gloo
  simulated   `--nodes 2 --gpus 1`: the launcher starts two node agents on this machine
  two-agents  `--nodes 2 --gpus 1 --node-rank K --master-addr 127.0.0.1 --master-port P`, K = 0
              and 1 started by this test at once, one output_dir and run_id (node 0's run
              directory is the one checked; on one machine both nodes write into it)
  slurm       `--cluster slurm --nodes 2 --gpus 1 --wait` on the dev cluster (tests/test_slurm.py's
              `slurm_env` fixture; skipped without SLURM)
  ray         `--cluster ray --nodes 2 --gpus 1 --wait` on a real two-node Ray cluster started on this
              machine (tests/test_ray.py's `ray2` fixture; skipped without ray installed)

Per backend, one successful run of tests/scripts/contract.py, one with a failing rank and one
of the built-in trainer are shared by the tests (module-scoped fixtures); the Ctrl-C test starts
its own job. The commands that read runs afterwards (ls, the board, status, logs) are held to the
same contract over those jobs. That every registered backend implements the one Backend interface
is a unit check beside this suite (tests/test_backend_registry.py); docs/backends.md says how to
run this suite on a new backend.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List

import psutil
import pytest

from tests.board_helpers import board, get_json
from tests.helpers import (QUICK, REPO, descendants, finish_all, free_port, kill_group, read_summary, run_launcher,
                           start_launcher, wait_gone)
from tests.test_slurm import slurm_env  # noqa: F401  (the SLURM dev cluster's fixture, reused)
from tests.test_ray import ray2  # noqa: F401  (the Ray dev cluster's fixture, reused)
from tests.ray_cluster import ray_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SPLIT_XDIST_BY = "backend"  # each backend's shared jobs on one xdist worker (tests/conftest.py)

SCRIPT = REPO / "tests" / "scripts" / "contract.py"
FAILURE = "RuntimeError: contract: rank 1 fails on purpose"
TRAINER_STEPS = 20
RUN_TIMEOUT = 150  # one launch, start to end; SLURM adds scheduling and polling
SLURM_TIMEOUT = 240


@dataclass
class Backend:
    name: str
    nodes: int
    per_node: int
    root: Path
    env: Dict[str, str] = field(default_factory=dict)

    @property
    def world(self) -> int:
        return self.nodes * self.per_node

    @property
    def kind(self) -> str:
        """The kind its runs record and `ls` shows: the launcher's name for the engine that ran them."""
        return {"two-agents": "multinode"}.get(self.name, self.name)

    def flags(self) -> List[str]:
        return ["--gpus", "2"] if self.name == "local" else ["--nodes", "2", "--gpus", "1"]


@dataclass
class Job:
    codes: List[int]  # the launcher's exit code; two-agents: node 0's, then node 1's
    console: str  # what the user saw: stdout and stderr (node 0's for two-agents)
    consoles: List[str]
    run_dir: Path
    out: Path  # where the script wrote its records


BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("simulated", id="simulated"),
    pytest.param("two-agents", id="two-agents"),
    pytest.param("slurm", id="slurm", marks=pytest.mark.slurm),
    pytest.param("ray", id="ray", marks=pytest.mark.ray),
]


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request, tmp_path_factory) -> Backend:
    name = request.param
    env = request.getfixturevalue("slurm_env") if name == "slurm" else {}
    if name == "ray":
        env = ray_env(request.getfixturevalue("ray2"))
    root = tmp_path_factory.mktemp(name)
    yield Backend(name, 1 if name == "local" else 2, 2 if name == "local" else 1, root, env)
    if name == "slurm":  # a job left running by a timed-out test must not hold the cluster
        for job_file in root.glob("*/runs/*/job.json"):
            job_id = str(json.loads(job_file.read_text())["job_id"])
            subprocess.run(["scancel", job_id], capture_output=True, timeout=30)


def run_dir_of(runs: Path) -> Path:
    found = [p for p in runs.iterdir() if p.is_dir()] if runs.is_dir() else []
    assert len(found) == 1, f"expected one run directory in {runs}, found {found}"
    return found[0]


def run_job(backend: Backend, tag: str, job_args: Callable[[Path], List[str]]) -> Job:
    """Run one job to its end on the backend; job_args(out) is what follows the flags."""
    where = backend.root / tag
    out, runs = where / "out", where / "runs"
    out.mkdir(parents=True)
    args = job_args(out)
    if backend.name in ("local", "simulated"):
        done = run_launcher([*backend.flags(), f"output_dir={runs}", *args], cwd=where, timeout=RUN_TIMEOUT)
        codes, consoles = [done.returncode], [done.stdout + done.stderr]
    elif backend.name == "two-agents":
        procs = start_two_agents(backend, where, runs, args)
        consoles = finish_all(procs, timeout=RUN_TIMEOUT)
        codes = [p.returncode for p in procs]
    elif backend.name == "ray":
        submit = ["--cluster", "ray", *backend.flags(), "--wait", f"output_dir={runs}"]
        done = run_launcher([*submit, *args], cwd=where, timeout=SLURM_TIMEOUT, env=backend.env)
        codes, consoles = [done.returncode], [done.stdout + done.stderr]
    else:
        submit = ["--cluster", "slurm", *backend.flags(), "slurm.time_min=5", "--wait", f"output_dir={runs}"]
        done = run_launcher([*submit, *args], cwd=where, timeout=SLURM_TIMEOUT, env=backend.env)
        codes, consoles = [done.returncode], [done.stdout + done.stderr]
    return Job(codes, consoles[0], consoles, run_dir_of(runs), out)


def start_two_agents(backend: Backend, where: Path, runs: Path, args: List[str]) -> List[subprocess.Popen]:
    """Node 0 and node 1 as two machines would start them, at once (static rendezvous on loopback)."""
    port, run_id = free_port(), f"contract-{uuid.uuid4().hex[:8]}"
    return [start_launcher([*backend.flags(), "--node-rank", str(k), "--master-addr", "127.0.0.1", "--master-port",
                            str(port), "--rdzv-timeout", "60", f"output_dir={runs}", f"run_id={run_id}", *args], where)
            for k in (0, 1)]


def script(*extra: str) -> Callable[[Path], List[str]]:
    return lambda out: [str(SCRIPT), "--out", str(out), *extra]


@pytest.fixture(scope="module")
def script_job(backend) -> Job:
    return run_job(backend, "script-ok", script())


@pytest.fixture(scope="module")
def failing_job(backend) -> Job:
    # W&B is outside this contract: the successful and the Ctrl-C'd script jobs keep the default offline run
    # (started and ended on every backend); here it would only cost its service's start-up
    # the other ranks compute on for a few seconds: the launcher stops them before they see their peer gone
    # (a Ray driver stops the other node agents; node 0 must still say the job failed, and why)
    fails = script("--fail-rank", "1", "--peers-late", "4")
    return run_job(backend, "script-fails", lambda out: ["wandb.mode=disabled", *fails(out)])


@pytest.fixture(scope="module")
def exiting_job(backend) -> Job:
    # rank 1 exits 3 with no error of its own; the others, in their barrier, fail at once on the connection it closed
    exits = script("--fail-rank", "1", "--exit-code", "3")
    return run_job(backend, "script-exits", lambda out: ["wandb.mode=disabled", *exits(out)])


@pytest.fixture(scope="module")
def trainer_job(backend) -> Job:
    # W&B is outside this contract (tests/test_metrics_runs.py has it); off, its service costs no start-up here
    trainer = [*QUICK, f"trainer.steps={TRAINER_STEPS}", "trainer.log_every=10", "wandb.mode=disabled"]
    return run_job(backend, "trainer", lambda out: trainer)


def records(out: Path, what: str = "seen") -> Dict[int, dict]:
    found = {}
    for path in sorted(out.glob(f"{what}-*")):
        if path.name.endswith(".tmp"):
            continue
        rank = int(path.name.split("-")[1].split(".")[0])
        found[rank] = json.loads(path.read_text())
    return found


# ----------------------------------------------------------------------------- the contract

def test_the_script_sees_torchruns_environment_for_its_place_in_the_job(backend, script_job):
    seen = records(script_job.out)
    assert sorted(seen) == list(range(backend.world)), script_job.console[-3000:]  # every rank, once
    for rank, s in seen.items():
        assert (s["RANK"], s["pg_rank"]) == (str(rank), rank)
        assert (s["WORLD_SIZE"], s["pg_world_size"]) == (str(backend.world), backend.world)
        # the node layout: per_node workers on each of nodes nodes, ranks filled node by node
        assert s["LOCAL_WORLD_SIZE"] == str(backend.per_node), s
        assert s["LOCAL_RANK"] == str(rank % backend.per_node), s
        assert s["GROUP_RANK"] == str(rank // backend.per_node), s
        assert s["ROLE_NAME"] and s["MASTER_ADDR"] and s["MASTER_PORT"], s
        assert s["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert s["allreduce"] == sum(range(1, backend.world + 1))  # 1 + 2: every rank took part
    for key in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "ROLE_NAME"):
        assert len({s[key] for s in seen.values()}) == 1, (key, seen)  # one job, not two
    assert len({s["pid"] for s in seen.values()}) == backend.world  # a process per rank


def test_a_successful_job_exits_0(backend, script_job):
    assert script_job.codes == [0] * len(script_job.codes), script_job.console[-3000:]
    assert not any("Traceback" in console for console in script_job.consoles)


def test_a_failing_rank_fails_the_job_and_is_named_with_its_error(backend, failing_job):
    assert failing_job.codes[0] == 1, failing_job.console[-3000:]  # docs/run-directory.md: 1 = a worker failed
    assert all(code != 0 for code in failing_job.codes), failing_job.codes
    named = [line for line in failing_job.console.splitlines() if "rank 1 failed" in line]
    assert any(FAILURE in line for line in named), failing_job.console[-3000:]
    summary = read_summary(failing_job.run_dir)
    assert summary["status"] == "failed", summary
    assert "rank 1 failed" in summary["error"] and FAILURE in summary["error"], summary
    assert FAILURE in (failing_job.run_dir / "logs" / "rank-1.log").read_text()


def test_the_rank_that_exited_first_is_blamed_not_the_peers_that_failed_on_it(backend, exiting_job):
    assert exiting_job.codes[0] == 1, exiting_job.console[-3000:]
    summary = read_summary(exiting_job.run_dir)
    assert summary["status"] == "failed" and "rank 1 failed: exit code 3" in summary["error"], summary
    assert (summary["root_cause"]["rank"], summary["root_cause"]["how"]) == (1, "exited"), summary["root_cause"]
    verdicts = [line for line in exiting_job.console.splitlines()  # the launcher's last word (error: ..., SLURM job N
                if line.startswith(("error:", "[launcher]")) and " failed: " in line]  # FAILED: ..., ...)
    assert verdicts and "rank 1 failed: exit code 3" in verdicts[-1], exiting_job.console[-3000:]


def test_the_run_directory_holds_config_plan_a_log_per_rank_and_the_summary(backend, script_job):
    run_dir = script_job.run_dir
    for name in ("config.yaml", "plan.json", "summary.json"):
        assert (run_dir / name).is_file(), sorted(p.name for p in run_dir.iterdir())
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (plan["world_size"], plan["nodes"]) == (backend.world, backend.nodes), plan
    logs = sorted(p.name for p in (run_dir / "logs").glob("rank-*.log"))
    assert logs == [f"rank-{r}.log" for r in range(backend.world)], logs
    for rank in range(backend.world):  # each rank's output in its own log, and only there
        text = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        said = [r for r in range(backend.world) if f"contract: hello from rank {r}\n" in text]
        assert said == [rank], (rank, text[-2000:])


def shape_of(summary: dict) -> tuple:
    """What every summary says about the job, whatever its outcome (docs/run-directory.md)."""
    wall = summary.get("wall_s")
    return (summary.get("world_size"), summary.get("nodes"), isinstance(wall, (int, float)) and wall > 0,
            summary.get("restarts"))


@pytest.mark.parametrize("outcome", ["completed", "failed"])
def test_the_summary_says_how_the_job_ended_and_its_shape(backend, request, outcome):
    job = request.getfixturevalue("script_job" if outcome == "completed" else "failing_job")
    summary = read_summary(job.run_dir)
    assert summary["status"] == outcome, summary
    assert summary["run_id"] == job.run_dir.name
    assert shape_of(summary) == (backend.world, backend.nodes, True, 0), summary  # world, nodes, wall_s > 0, restarts
    if outcome == "completed":  # the id torch's agent gave the workers is the run's
        assert {s["TORCHELASTIC_RUN_ID"] for s in records(job.out).values()} == {summary["run_id"]}


def test_a_failed_jobs_summary_names_where_it_ran_as_a_finished_ones_does(backend, script_job, failing_job):
    """launch_mode and rendezvous say where a job ran; they do not change with how it ended."""
    finished, failed = read_summary(script_job.run_dir), read_summary(failing_job.run_dir)
    where = [(s.get("launch_mode"), s.get("rendezvous")) for s in (finished, failed)]
    assert where[0] == where[1], (finished, failed)
    if backend.nodes > 1:
        assert where[0][0] is not None and where[0][1] in ("static", "c10d"), finished
    if backend.name == "slurm":  # docs/slurm.md: the summary names the SLURM job, whatever the outcome
        submitted = json.loads((failing_job.run_dir / "job.json").read_text())["job_id"]
        assert finished.get("slurm_job_id") and str(failed.get("slurm_job_id")) == str(submitted), (finished, failed)


@pytest.mark.parametrize("outcome", ["completed", "failed"])
def test_a_multi_node_summary_lists_the_nodes_and_their_ranks(backend, request, outcome):
    """docs/several-machines.md: summary.json has `node_list`, for a failed job too."""
    if backend.nodes == 1:
        pytest.skip("node_list is promised for multi-node jobs")
    job = request.getfixturevalue("script_job" if outcome == "completed" else "failing_job")
    summary = read_summary(job.run_dir)
    assert summary["status"] == outcome, summary
    expected = [{"node_rank": k, "ranks": list(range(k * backend.per_node, (k + 1) * backend.per_node))}
                for k in range(backend.nodes)]
    listed = [{"node_rank": n["node_rank"], "ranks": n["ranks"]} for n in summary.get("node_list", [])]
    assert listed == expected, summary


def test_the_built_in_trainer_completes_and_reports_its_throughput(backend, trainer_job):
    assert trainer_job.codes == [0] * len(trainer_job.codes), trainer_job.console[-3000:]
    summary = read_summary(trainer_job.run_dir)
    assert summary["status"] == "completed", summary
    assert (summary["world_size"], summary["nodes"]) == (backend.world, backend.nodes), summary
    assert summary["steps"] == TRAINER_STEPS, summary
    assert isinstance(summary["samples_per_s"], (int, float)) and summary["samples_per_s"] > 0, summary


# ----------------------------------------------------------------------------- reading runs back

def launcher_says(backend: Backend, args: List[str], cwd: Path) -> "subprocess.CompletedProcess[str]":
    return run_launcher(args, cwd=cwd, timeout=60, env=backend.env)


def test_ls_and_the_board_list_each_run_as_the_kind_that_ran_it(backend, script_job):
    runs = script_job.run_dir.parent
    listed = launcher_says(backend, ["ls", str(runs), "--json"], runs)
    assert listed.returncode == 0, listed.stderr
    rows = {row["run_id"]: row for row in json.loads(listed.stdout)}
    row = rows[script_job.run_dir.name]
    assert (row["kind"], row["status"], row.get("kind_guessed")) == (backend.kind, "completed", None), row
    with board(runs) as b:  # the board's run list is the same rows
        shown = {r["run_id"]: r for r in get_json(b.url("/api/runs"))["runs"]}
    assert (shown[script_job.run_dir.name]["kind"], shown[script_job.run_dir.name]["status"]) == (backend.kind, "completed")


@pytest.mark.parametrize("outcome", ["completed", "failed"])
def test_status_says_how_the_run_ended_with_the_exit_code_wait_would_give(backend, request, outcome):
    job = request.getfixturevalue("script_job" if outcome == "completed" else "failing_job")
    said = launcher_says(backend, ["status", str(job.run_dir)], job.run_dir)
    assert said.returncode == (0 if outcome == "completed" else 1), said.stdout + said.stderr
    assert ("COMPLETED" if outcome == "completed" else "FAILED") in said.stdout, said.stdout
    assert f"run directory {job.run_dir}" in said.stdout
    if outcome == "failed":  # the root cause, as the summary names it
        assert "rank 1 failed" in said.stdout, said.stdout


def test_logs_prints_a_failed_runs_root_cause_rank_and_any_rank_asked_for(backend, failing_job):
    run_dir = failing_job.run_dir
    failed = launcher_says(backend, ["logs", str(run_dir)], run_dir)
    assert failed.returncode == 0 and FAILURE in failed.stdout, failed.stdout[-2000:] + failed.stderr
    assert "rank 1" in failed.stderr  # it says whose log it chose
    rank0 = launcher_says(backend, ["logs", run_dir.name, "--output-dir", str(run_dir.parent), "--rank", "0"], run_dir)
    assert rank0.returncode == 0 and "contract: hello from rank 0\n" in rank0.stdout, rank0.stdout[-2000:] + rank0.stderr


# ----------------------------------------------------------------------------- Ctrl-C

def wait_for_ranks(out: Path, world: int, procs: List[subprocess.Popen], timeout: float) -> Dict[int, dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = records(out, "ready")
        if len(ready) == world:
            return ready
        ended = [p.returncode for p in procs if p.poll() is not None]
        assert not ended, f"a launcher ended (exit {ended}) before every rank was up"
        time.sleep(0.2)
    raise AssertionError(f"only ranks {sorted(records(out, 'ready'))} of {world} came up within {timeout}s")


def test_ctrl_c_stops_the_job_with_130_says_interrupted_and_leaves_no_process(backend):
    if backend.name == "slurm":
        # Ctrl-C on `--cluster slurm --wait` only stops the waiting; the job goes on in SLURM by
        # design (its way to stop a job is `python -m launcher cancel RUN`, tests/test_slurm.py),
        # and its workers are slurmd's children, not the Ctrl-C'd launcher's.
        pytest.skip("a submitted SLURM job outlives Ctrl-C of the waiting launcher by design")
    where = backend.root / "ctrl-c"
    out, runs = where / "out", where / "runs"
    out.mkdir(parents=True)
    args = script("--block")(out)
    if backend.name == "two-agents":
        procs = start_two_agents(backend, where, runs, args)
    elif backend.name == "ray":  # Ctrl-C of `--cluster ray --wait` stops the job: this process drives it
        procs = [start_launcher(["--cluster", "ray", *backend.flags(), "--wait", f"output_dir={runs}", *args], where,
                                env=backend.env)]
    else:
        procs = [start_launcher([*backend.flags(), f"output_dir={runs}", *args], where)]
    try:
        ready = wait_for_ranks(out, backend.world, procs, timeout=90)
        ranks = [psutil.Process(r["pid"]) for r in ready.values()]  # the pids the ranks recorded, alive now
        everything = [p for proc in procs for p in descendants(proc.pid)]
        # Ctrl-C in the terminal of the launcher (two-agents: node 0's only; node 1 must follow)
        os.killpg(procs[0].pid, signal.SIGINT)
        consoles = finish_all(procs, timeout=45)
    finally:
        for proc in procs:
            kill_group(proc)
    assert procs[0].returncode == 130, consoles[0][-3000:]
    if backend.name == "two-agents":  # it lost its peer: it ends as well, not as a success
        assert procs[1].returncode not in (0, None), consoles[1][-3000:]
    summary = read_summary(run_dir_of(runs))
    assert summary["status"] == "interrupted", summary
    assert summary["run_id"] == run_dir_of(runs).name
    assert shape_of(summary) == (backend.world, backend.nodes, True, 0), summary
    assert wait_gone(ranks, timeout=15) == [], [p.pid for p in ranks]
    assert wait_gone(everything, timeout=15) == []
