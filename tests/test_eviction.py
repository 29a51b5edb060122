"""A slow node replaced by a hot spare (launcher.evict_slow_after_s): the step rows name its rank the straggler, the
agent of rank 0's node says so on the round's store, that node leaves, and the spare takes its place at the same
world size. Then the job steps as fast as a uniform run of the same shape.

Real processes: simulated nodes on this machine (c10d, the store held by the launcher), gloo. The slow rank is slowed
by a sleep, and by a real cgroup that gives it 5% of a CPU (CPU contention), in the job's first attempt only: its
node's, which the spare replaces.
"""

import json
import os
import statistics
from pathlib import Path

import pytest

from tests.helpers import QUICK, QUIET, only_run_dir, read_summary, run_launcher
from tests.test_stragglers import cpu_limit  # noqa: F401  (the cgroup fixture)
from tests.wandb_records import run_summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SCRIPT = Path(__file__).parent / "scripts" / "slow_node.py"
SHAPE = ["--nodes", "2", "--spares", "1", "--gpus", "1", "--max-restarts", "2", "watchdog.timeout_s=0", *QUICK]
STEPS = 400


def run(tmp_path: Path, name: str, how: str, *settings: str):
    out = tmp_path / name
    out.mkdir()
    done = run_launcher([*SHAPE, *settings, f"output_dir={out / 'runs'}", str(SCRIPT), str(out), "1", how, str(STEPS)],
                        tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    return out, done.stderr


def step_time(out: Path, attempt: int) -> float:
    """Rank 0's median step time in one attempt, its first 50 steps (DDP's warm-up) left out."""
    times = [float(t) for t in (out / f"steps-{attempt}.txt").read_text().split()]
    assert len(times) == STEPS
    return statistics.median(times[50:])


@pytest.mark.quiet
@pytest.mark.parametrize("how", ["sleep", "cpu-limit"])
def test_a_slow_node_is_evicted_for_the_spare_and_the_job_steps_as_fast_as_a_uniform_one(tmp_path, request, how):
    slow = "sleep" if how == "sleep" else f"cgroup:{request.getfixturevalue('cpu_limit')}"
    out, err = run(tmp_path, "evicting", slow, "launcher.evict_slow_after_s=2")
    assert "evicting the node of rank 1: rank 1 was the straggler for" in err, err
    assert "this node leaves the job" in err and "replaced by" in err, err
    run_dir = only_run_dir(out / "runs")
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["world_size"] == 2, summary
    (change,) = summary["membership_changes"]
    assert change["evicted"]["rank"] == 1 and change["world_size"] == 2, change
    assert change["replaced"] and change["evicted"]["node"] == change["replaced"][0]["left"], change
    assert change["evicted"]["lagged_s"] >= 2
    (record,) = (run_dir / "goodput").glob("*-evicted-0.json")
    assert json.loads(record.read_text())["rank"] == 1
    # the job's one W&B run, in a folder for each node that ran rank 0 (the spare's the newest: it ends the run)
    last = sorted((run_dir / "wandb").glob("offline-run-*"))[-1]
    assert run_summary(last)["evictions"] == 1
    assert not (out / "steps-0.txt").exists()  # the slow attempt never ran to its end: the spare's did
    uniform, _ = run(tmp_path, "uniform", "none")
    ratio = step_time(out, 1) / step_time(uniform, 0)
    assert ratio <= 1.10, f"after the eviction a step took {ratio:.2f}x the uniform run's"


def test_a_slow_node_stays_where_eviction_is_off(tmp_path):
    """Off by default: the straggler is named and the job ends on the nodes it began with."""
    out, err = run(tmp_path, "off", "sleep")
    assert "straggler at step" in err and "evicting" not in err, err
    summary = read_summary(only_run_dir(out / "runs"))
    assert "membership_changes" not in summary and (out / "steps-0.txt").exists()


@pytest.mark.parametrize("flags, said", [
    (["launcher.evict_slow_after_s=5"], "replaces a slow node with a hot spare, and this job has none: add --spares 1"),
    (["--spares", "1", "--max-restarts", "2", "launcher.evict_slow_after_s=-1"], "must be 0 (off) or seconds"),
])
def test_an_eviction_that_cannot_work_is_refused_in_one_line(tmp_path, flags, said):
    done = run_launcher(["--nodes", "2", "--gpus", "1", *flags, f"output_dir={tmp_path / 'runs'}", *QUIET], tmp_path,
                        timeout=60)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()
    assert os.listdir(tmp_path) == []


def test_the_judge_names_a_node_only_after_rows_named_its_rank_the_whole_time_and_a_spare_waits(tmp_path):
    """Eviction's rule on its own, with a real store and rows appended as rank 0's node writes them."""
    from types import SimpleNamespace

    from torch.distributed import HashStore

    from launcher.agent.eviction import LOOK_S, Evicted, Eviction

    now, spares, store = [100.0], [0], HashStore()
    rows = tmp_path / "metrics.jsonl"
    rows.write_text(json.dumps({"step": 1, "straggler_rank": 1}) + "\n")  # before the round: judges nobody

    def group(ranks):
        return SimpleNamespace(store=store, workers=[SimpleNamespace(global_rank=r) for r in ranks])

    def row(step, rank):
        with rows.open("a") as f:
            f.write(json.dumps({"step": step, "straggler_rank": rank, "straggler": f"rank {rank} computes 4.0x"}) + "\n")

    judge, slow = (Eviction(str(tmp_path), 5.0, lambda _: spares[0], clock=lambda: now[0]) for _ in range(2))
    judge.round_started(group([0]), 3)
    slow.round_started(group([1]), 3)
    told_at = None
    for step, rank in enumerate([1, None, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], start=2):
        if step == 10:
            spares[0] = 1  # from here a spare waits
        row(step, rank)
        now[0] += LOOK_S
        judge.look(None)  # the judge's own ranks are not named: it never leaves
        try:
            slow.look(None)
        except Evicted as e:
            told_at = step
            assert "rank 1 was the straggler for" in str(e) and "rank 1 computes 4.0x" in str(e), str(e)
            break
        assert not store.check(["launcher/evict/3"]) or step == 10
    # named again at step 4 (step 3 named nobody); 5 s at step 9, but the spare came at step 10
    assert told_at == 10, told_at
    word = json.loads(store.get("launcher/evict/3"))
    assert word["rank"] == 1 and word["lagged_s"] == 6.0, word
