"""Real multi-process runs: per-step metrics, the W&B run (offline, resumed, failing online) and the scale sweep."""

import json
import socket
import sys

from types import SimpleNamespace

import pytest

from tests.helpers import QUICK, only_run_dir, read_metrics, read_summary, run_launcher, run_stamped

pytestmark = pytest.mark.timeout(180)

FAKE_KEY = "fakekey0123456789launchertest0123456789"  # 40 characters, like a real key
PHASE_KEYS = {"time_data_s", "time_forward_s", "time_backward_s", "time_optimizer_s", "time_comm_s", "comm_share",
              "rss_peak_mb", "cpu_percent", "step_time_spread", "slowest_rank", "straggler_rank", "mfu_note"}


def _grep_tree(root, needle: str):
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


@pytest.fixture(scope="module")
def requeued_job(tmp_path_factory):
    """One job on 2 workers with W&B's offline run and an API key in its environment, read as it ends; then continued
    in its run directory as a requeue does, and run again without W&B or the comm hook. The metrics test reads the
    first launch, the comm hook test all three (one launch less than a job of its own for each: ~6 CPU-s)."""
    root = tmp_path_factory.mktemp("job")
    env = {"WANDB_API_KEY": FAKE_KEY}
    common = ["--gpus", "2", "trainer.steps=20", "trainer.log_every=5", "run_id=job1", *QUICK]
    first = run_launcher([f"output_dir={root / 'a'}", "wandb.tags=[a,b]", *common], cwd=root, env=env)
    assert first.returncode == 0, first.stderr
    run_dir = root / "a" / "job1"
    # what the requeue below changes: metrics.jsonl grows, summary.json is rewritten, a second W&B run appears
    ended = {"metrics": read_metrics(run_dir), "summary": read_summary(run_dir),
             "wandb_runs": sorted((run_dir / "wandb").glob("offline-run-*"))}
    # continuing in the same run dir, as a requeue does (a new launch there is refused: only resume continues a run)
    again = run_launcher(["resume", str(run_dir), "trainer.steps=24"], cwd=root, env=env)
    plain = run_launcher([f"output_dir={root / 'b'}", "metrics.detailed=false", "wandb.mode=disabled", *common],
                         cwd=root, env=env)
    for r in (again, plain):
        assert r.returncode == 0, r.stderr
    return {"root": root, "run_dir": run_dir, "plain_dir": root / "b" / "job1", "ended": ended,
            "outputs": [r.stdout + r.stderr for r in (first, again, plain)]}


def test_metrics_and_one_offline_wandb_run_and_the_key_stays_secret(requeued_job):
    run_dir, ended, output = requeued_job["run_dir"], requeued_job["ended"], requeued_job["outputs"][0]
    metrics = ended["metrics"]
    assert [m["step"] for m in metrics] == [5, 10, 15, 20]
    for m in metrics:
        assert PHASE_KEYS <= set(m), PHASE_KEYS - set(m)
        assert 0 <= m["comm_share"] <= 1.5 and m["time_comm_s"] > 0, "DDP's all-reduce is timed on 2 workers"
        assert m["rss_peak_mb"] > 50 and 0 <= m["cpu_percent"] <= 100 and m["slowest_rank"] in (0, 1)
    summary = ended["summary"]
    assert summary["rss_peak_mb"] > 50 and 0 < summary["comm_share"] < 1.5
    assert 0 < summary["metrics_overhead_share"] < 0.5  # measured, not asserted small: bench/ reports it
    assert "mfu_percent" not in summary and "CUDA" in summary["mfu_note"]
    assert "ETA" in output  # plain progress lines off a terminal
    # exactly one W&B run, from rank 0, inside the run directory, with the run id stored beside it
    run_id = (run_dir / "wandb_run_id").read_text().strip()
    runs = ended["wandb_runs"]
    assert len(runs) == 1 and runs[0].name.endswith(run_id)
    assert b"samples_per_s" in next(runs[0].glob("*.wandb")).read_bytes()
    assert (runs[0] / "files" / "config.yaml").is_file() and (runs[0] / "files" / "metrics.jsonl").is_file()
    # the key never reaches a run directory or the console (of this launch, its requeue, or the run without W&B)
    assert _grep_tree(requeued_job["root"], FAKE_KEY) == []
    assert all(FAKE_KEY not in out for out in requeued_job["outputs"])


def test_a_checkpoint_save_is_not_counted_as_the_next_steps_data_wait(tmp_path):
    """A save between steps once landed in the next step's data phase and in the mean step time MFU divides by
    (an H100's 21% read 5.6%). The save of step 10 takes 3 s here; the data wait of synthetic batches is ms."""
    result = run_launcher(["--gpus", "1", f"output_dir={tmp_path}", "trainer.steps=20", "trainer.log_every=5",
                           "checkpoint.every_steps=5", "wandb.mode=disabled", *QUICK], cwd=tmp_path,
                          env={"LAUNCHER_TEST_SAVE_DELAY_S": "3,step=10"})
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    assert "save of step 10 delayed" in (run_dir / "logs" / "rank-0.log").read_text()
    summary, window = read_summary(run_dir), read_metrics(run_dir)[2]  # steps 11-15: the step after the save
    assert summary["time_data_s"] < 0.05 and window["time_data_s"] < 0.1, (summary["time_data_s"], window)
    phases = sum(summary[f"time_{name}_s"] for name in ("data", "forward", "backward", "optimizer"))
    assert phases < 0.1, summary  # each step of this model takes a few ms; 3 s over 17 steps would be 0.18


def test_the_comm_hook_does_not_change_results_and_a_requeued_job_resumes_its_wandb_run(requeued_job):
    run_dir, plain_dir = requeued_job["run_dir"], requeued_job["plain_dir"]
    assert requeued_job["ended"]["summary"]["param_checksum"] == read_summary(plain_dir)["param_checksum"]
    run_id = (run_dir / "wandb_run_id").read_text().strip()
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(f"-{run_id}") for r in runs), runs
    assert not (plain_dir / "wandb").exists() and not (plain_dir / "wandb_run_id").exists()
    assert "time_comm_s" not in read_metrics(plain_dir)[0]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_wandb_online_without_a_server_warns_once_and_training_completes(tmp_path):
    env = {"WANDB_API_KEY": FAKE_KEY, "WANDB_BASE_URL": f"http://127.0.0.1:{_closed_port()}", "WANDB_MODE": ""}
    result = run_launcher(["--gpus", "2", f"output_dir={tmp_path}", "trainer.steps=10", "wandb.mode=online", *QUICK],
                          cwd=tmp_path, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (result.stdout + result.stderr).count("warning: W&B") == 1
    run_dir = only_run_dir(tmp_path)
    assert read_summary(run_dir)["status"] == "completed" and len(read_metrics(run_dir)) == 1
    assert _grep_tree(tmp_path, FAKE_KEY) == [] and FAKE_KEY not in result.stdout + result.stderr


def test_scale_sweep_writes_json_markdown_plot_and_prints_the_table(tmp_path):
    code, lines, _ = run_stamped([sys.executable, "-m", "launcher", "scale", "--gpus", "1,2", "--mode", "weak", "--rounds",
                                  "2", "--max-rounds", "2", "--spread", "0.000001", f"output_dir={tmp_path}",
                                  "trainer.steps=12", *QUICK], tmp_path, 300)
    result = SimpleNamespace(stdout="\n".join(line for _, s, line in lines if s == "out"),
                             stderr="\n".join(line for _, s, line in lines if s == "err"))
    assert code == 0, result.stderr
    sweep = only_run_dir(tmp_path)
    # each size's run is said as it starts and as it ends, with its throughput
    out = [(at, line) for at, s, line in lines if s == "out"]
    for workers, rounds in ((1, ("n1-g1", "n1-g1-r2")), (2, ("n1-g2", "n1-g2-r2"))):
        for number, run_id in enumerate(rounds, 1):
            size = f"scale: {workers} worker(s) (1 node x {workers})"
            started = next(at for at, line in out if line == f"{size}, batch 16 per worker, round {number} ...")
            ended = next(at for at, line in out if line.startswith(f"{size}, round {number}: completed in ")
                         and line.endswith(" samples/s"))
            assert started < (sweep / "runs" / run_id / "summary.json").stat().st_mtime <= ended, run_id
    scale = json.loads((sweep / "scale.json").read_text())
    assert scale["mode"] == "weak" and [s["world_size"] for s in scale["sizes"]] == [1, 2]
    for size in scale["sizes"]:
        assert {"world_size", "nodes", "samples_per_s", "step_time_s_median", "scaling_efficiency", "speedup",
                "comm_share", "peak_memory_mb"} <= set(size)
        assert size["samples_per_s"] > 0 and size["batch_per_worker"] == 16
        assert size["rounds"] == 2 and size["spread"] > 0 and len(size["samples_per_s_rounds"]) == 2
        low, high = size["efficiency_range"]
        assert low <= size["scaling_efficiency"] <= high
    base, two = scale["sizes"]
    assert base["scaling_efficiency"] == 1.0
    assert two["scaling_efficiency"] == pytest.approx(two["samples_per_s"] / (2 * base["samples_per_s"]))
    assert (sweep / "scale.png").read_bytes()[:4] == b"\x89PNG" and "| workers |" in (sweep / "scale.md").read_text()
    assert "efficiency" in result.stdout and "no GPU" in result.stdout  # the table, and the plain warning
    assert "scale: noisy: throughput spread up to" in result.stdout and scale["noisy"].startswith("noisy:")
    assert sorted(p.name for p in (sweep / "runs").iterdir()) == ["n1-g1", "n1-g1-r2", "n1-g2", "n1-g2-r2"]
    assert len(list((sweep / "wandb").glob("offline-run-*"))) == 1  # the sweep's own W&B run with the table


@pytest.mark.parametrize("args, words", [
    (["scale", "--gpus", "1,2", "--nodes", "0,1"], "every size must be at least 1"),
    (["scale", "--gpus", "1,3"], "cannot split evenly"),
    (["scale", "--gpus", "x"], "comma-separated"),
    (["--gpus", "1", "metrics.progress=fancy"], "metrics.progress=fancy is not one of"),
])
def test_bad_sweep_and_metrics_input_is_one_line(tmp_path, args, words):
    result = run_launcher([*args, f"output_dir={tmp_path}"], cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    assert words in result.stderr and "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
