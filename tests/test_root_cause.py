"""The rank that failed first is the one named, never a peer that failed because it had gone: each way of failing
(a non-zero exit, an exception, SIGKILL) on rank 1 of 2, and on rank 3 of 4 across 2 nodes, with the others in a
collective that then fails on the closed connection ("Connection closed by peer"), as in a real job.

Across nodes each node names its own first failed rank and when it failed (summary.json's root_cause.failed_at);
the job's is the earliest (launcher.agent.failures.first_cause). The SLURM and Ray jobs of the backend contract
(tests/test_backend_contract.py) hold the same for their engines."""

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import launcher_env, only_run_dir, read_summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
SCRIPT = Path(__file__).parent / "scripts" / "fail_first.py"
SAID = {"exit": "exit code 3", "raise": "exit code 1: ValueError: rank {rank} fails on purpose at step 5",
        "kill": "killed by SIGKILL"}


@pytest.mark.parametrize("how", ["exit", "raise", "kill"])
@pytest.mark.parametrize("shape, rank", [(["--gpus", "2"], 1), (["--nodes", "2", "--gpus", "2"], 3)],
                         ids=["rank-1-of-2", "rank-3-of-4-on-2-nodes"])
def test_the_rank_that_failed_first_is_named_not_the_peers_that_failed_on_it(tmp_path, shape, rank, how):
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "launcher", *shape, f"output_dir={tmp_path}", "wandb.mode=disabled",
                           "watchdog.timeout_s=0", str(SCRIPT), str(rank), how],
                          cwd=tmp_path, env=launcher_env(), capture_output=True, text=True, timeout=200)
    assert done.returncode == 1, done.stderr[-3000:]
    said = SAID[how].format(rank=rank)
    last = [line for line in done.stderr.splitlines() if line.startswith("error:")][-1]
    assert re.search(rf"\brank {rank} failed: {re.escape(said)}", last), done.stderr[-3000:]
    summary = read_summary(only_run_dir(tmp_path))
    assert summary["status"] == "failed" and f"rank {rank} failed: {said}" in summary["error"], summary["error"]
    cause = summary["root_cause"]
    assert (cause["rank"], cause["how"]) == (rank, "killed" if how == "kill" else "exited"), cause
    assert cause["log"] == f"logs/rank-{rank}.log" and started < cause["failed_at"] < time.time(), cause


def test_a_failed_runs_summary_has_its_exit_code_and_its_log_the_last_line_printed(tmp_path):
    done = subprocess.run([sys.executable, "-m", "launcher", "--gpus", "2", f"output_dir={tmp_path}", "wandb.mode=disabled",
                           "watchdog.timeout_s=0", str(SCRIPT), "1", "exit"],
                          cwd=tmp_path, env=launcher_env(), capture_output=True, text=True, timeout=200)
    run_dir = only_run_dir(tmp_path)
    assert done.returncode == 1 and read_summary(run_dir)["exit_code"] == 1
    last = [line for line in done.stderr.splitlines() if line.startswith("error:")][-1]
    assert (run_dir / "logs" / "launcher.log").read_text().splitlines()[-1].endswith(last)
