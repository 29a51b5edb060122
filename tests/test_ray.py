"""--cluster ray on a real two-node Ray cluster started on this machine (tests/ray_cluster.py).

A user's torchrun-style script runs unchanged and ends with the parameters a local run of the same
job has; a refused job (no Ray, no cluster, a placement that cannot fit) is one line, exit 2, and
leaves nothing behind, on disk or on the cluster; a submitted job is followed and cancelled through
status/logs/cancel. The conformance suite (tests/test_backend_contract.py) runs here too.
"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import NO_WANDB, QUICK, REPO, free_port, read_metrics, read_summary, run_launcher
from tests.ray_cluster import ray_cluster, ray_env
from tests.ray_launches import SLOW_FROM_10, launch_once, line

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(300)]
TUTORIAL = REPO / "tests" / "scripts" / "ddp_tutorial.py"


@pytest.fixture(scope="module")
def ray2(tmp_path_factory):
    yield from ray_cluster(tmp_path_factory, 2)


def only_dir(runs: Path) -> Path:
    found = [p for p in runs.iterdir() if p.is_dir()] if runs.is_dir() else []
    assert len(found) == 1, found
    return found[0]


def test_a_torchrun_tutorial_script_runs_unchanged_on_two_ray_nodes_and_matches_a_local_run(ray2, tmp_path):
    ray_out, local_out = tmp_path / "ray-out", tmp_path / "local-out"
    ray_out.mkdir(), local_out.mkdir()
    # no W&B run (nothing of W&B is checked here; tests/test_backend_contract.py runs Ray jobs with the default one)
    done = run_launcher(["--cluster", "ray", "--nodes", "2", "--gpus", "2", "--wait", f"output_dir={tmp_path / 'runs'}",
                         *NO_WANDB, str(TUTORIAL), "--out", str(ray_out)], cwd=tmp_path, timeout=240, env=ray_env(ray2))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "Traceback" not in done.stderr
    run_dir = only_dir(tmp_path / "runs")
    summary = read_summary(run_dir)
    assert (summary["status"], summary["world_size"], summary["nodes"], summary["cluster"]) == ("completed", 4, 2, "ray")
    assert summary["steps"] == 5 and summary["time_to_first_step_s"] > 0  # the script's own optimizer steps, seen
    assert len(read_metrics(run_dir)[-1]["step_time_s_per_rank"]) == 4  # every rank's, from both Ray nodes
    assert [n["ranks"] for n in summary["node_list"]] == [[0, 1], [2, 3]]
    assert len({p["ray_node_id"] for p in summary["ray_placement"]}) == 2  # two Ray nodes, one bundle each
    assert sorted(p.name for p in (run_dir / "logs").glob("rank-*.log")) == [f"rank-{r}.log" for r in range(4)]
    job = json.loads((run_dir / "job.json").read_text())
    assert job["state"] == "COMPLETED" and job["cluster"] == "ray"
    secretish = [p for p in run_dir.rglob("*") if p.is_file() and "LAUNCHER_RDZV_SECRET=" in p.read_text(errors="replace")]
    assert secretish == []
    local = run_launcher(["--gpus", "4", f"output_dir={tmp_path / 'local'}", *NO_WANDB, str(TUTORIAL), "--out", str(local_out)],
                         cwd=tmp_path, timeout=180)
    assert local.returncode == 0, local.stderr[-2000:]
    ray_result, local_result = (json.loads((d / "result.json").read_text()) for d in (ray_out, local_out))
    assert ray_result["checksum"] == local_result["checksum"], (ray_result, local_result)
    assert ray2.leftovers() == {"placement_groups": [], "actors": []}


def refused(args, cwd: Path, env) -> subprocess.CompletedProcess:
    done = run_launcher(["--cluster", "ray", *args, f"output_dir={cwd / 'runs'}", *QUICK], cwd=cwd, timeout=150, env=env)
    assert done.returncode == 2, (done.stdout + done.stderr)[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert not (cwd / "runs").exists() or not any((cwd / "runs").iterdir())  # nothing on disk
    return done


def test_a_placement_the_cluster_cannot_fit_is_one_line_and_leaves_nothing_on_the_cluster(ray2, tmp_path):
    done = refused(["--nodes", "3", "--gpus", "1", "ray.placement_timeout_s=5"], tmp_path, ray_env(ray2))
    assert "cannot place 3 node(s)" in done.stderr and "2 live node(s)" in done.stderr
    assert ray2.leftovers() == {"placement_groups": [], "actors": []}


def test_no_cluster_at_the_address_is_one_line(tmp_path):
    pytest.importorskip("ray")
    done = refused(["--nodes", "2", "--gpus", "1", f"ray.address=127.0.0.1:{free_port()}"], tmp_path, {"RAY_ADDRESS": ""})
    assert "no Ray cluster at ray.address=127.0.0.1:" in done.stderr


def test_no_address_at_all_names_ray_address(tmp_path):
    pytest.importorskip("ray")
    done = refused(["--nodes", "2", "--gpus", "1"], tmp_path, {"RAY_ADDRESS": ""})
    assert "ray.address=HOST:PORT" in done.stderr and "RAY_ADDRESS" in done.stderr


def test_without_ray_installed_the_error_says_how_to_install_it(tmp_path):
    # A python that cannot import ray: a `ray` package on the path that fails to import, as a
    # missing one does (the venv here has ray; this is the only way to take it away for one run).
    shadow = tmp_path / "no-ray"
    (shadow / "ray").mkdir(parents=True)
    (shadow / "ray" / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    done = refused(["--nodes", "2", "--gpus", "1", "ray.address=127.0.0.1:1"], tmp_path,
                   {"PYTHONPATH": str(shadow)})
    assert "pip install -e .[ray]" in done.stderr


def test_the_rest_of_the_launcher_never_imports_ray(tmp_path):
    code = ("import sys, launcher.cli, launcher.run, launcher.backends.dispatch, launcher.backends.local, "
            "launcher.backends.node, launcher.backends.slurm.submit, launcher.commands.resume; "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_dry_run_prints_the_placement_and_each_nodes_command_and_starts_nothing(tmp_path):
    pytest.importorskip("ray")
    done = run_launcher(["--cluster", "ray", "--nodes", "2", "--gpus", "3", "--dry-run", "ray.address=10.0.0.1:6379",
                         f"output_dir={tmp_path / 'runs'}", *QUICK], cwd=tmp_path, timeout=60, env={"RAY_ADDRESS": ""})
    assert done.returncode == 0, done.stderr
    assert "STRICT_SPREAD, 2 bundle(s) of {'CPU': 3.0, 'GPU': 3.0} (GPU only where the cluster has GPUs" in done.stdout
    assert "node 1 (ranks 3-5)" in done.stdout and "--node-rank 1" in done.stdout
    assert not (tmp_path / "runs").exists()


SHIPPED_SCRIPT = """
import json, os, sys
import torch.distributed as dist
from helper_here import VALUE  # a module of the submitting folder alone
dist.init_process_group("gloo")
record = {"file": os.path.realpath(__file__), "cwd": os.path.realpath(os.getcwd()), "value": VALUE,
          "ignored_file_shipped": os.path.exists("big.bin"), "git_shipped": os.path.exists(".git"),
          "link_shipped": os.path.lexists("notes")}
with open(os.path.join(sys.argv[1], f"rank-{dist.get_rank()}.json"), "w") as f:
    json.dump(record, f)
dist.barrier()
dist.destroy_process_group()
"""


def code_folder(root: Path) -> Path:
    """A user's folder: a script, a module it imports, a .gitignored 2 MB file, a .git folder and a link out of it."""
    code = root / "code"
    code.mkdir()
    (code / "train_here.py").write_text(SHIPPED_SCRIPT)
    (code / "helper_here.py").write_text("VALUE = 42\n")
    (code / ".gitignore").write_text("big.bin\n")
    (code / "big.bin").write_bytes(b"\0" * 2_000_000)
    (code / ".git").mkdir()
    (code / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "private.txt").write_text("not for the cluster\n")
    (code / "notes").symlink_to(root / "private.txt")  # Ray's zip would ship its target's bytes
    return code


def test_a_script_only_in_the_submitting_folder_runs_from_the_folder_shipped_to_the_nodes(ray2, tmp_path):
    code, out = code_folder(tmp_path), tmp_path / "out"
    out.mkdir()
    # ray.ship_limit_mb=1: the folder fits only because big.bin, in .gitignore, is left out
    done = run_launcher(["--cluster", "ray", "--nodes", "2", "--gpus", "1", "--wait", f"output_dir={tmp_path / 'runs'}",
                         "ray.ship_limit_mb=1", "train_here.py", str(out)], cwd=code, timeout=240, env=ray_env(ray2))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    records = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    for record in records:
        assert record["value"] == 42
        # run from Ray's unpacked copy, not from the submitting folder (which a real node does not have)
        assert not record["file"].startswith(str(code.resolve())), record
        assert Path(record["file"]).parent == Path(record["cwd"]) and "working_dir" in record["cwd"], record
        assert not record["ignored_file_shipped"] and not record["git_shipped"] and not record["link_shipped"], record
    assert "1 symbolic link(s) in" in done.stderr and "(notes)" in done.stderr
    assert ray2.leftovers() == {"placement_groups": [], "actors": []}


def test_a_working_folder_over_the_ship_limit_is_one_line_naming_its_size_and_the_fix(tmp_path):
    pytest.importorskip("ray")
    (tmp_path / "weights.bin").write_bytes(b"\0" * 3_000_000)
    done = refused(["--nodes", "2", "--gpus", "1", "ray.address=127.0.0.1:1", "ray.ship_limit_mb=2"], tmp_path, {})
    assert re.search(r"at least 2\.[0-9] MiB", done.stderr) and "ray.ship_limit_mb=2" in done.stderr
    assert ".gitignore" in done.stderr and "ray.ship_code=false" in done.stderr


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_a_submitted_job_is_followed_and_cancelled(ray2, tmp_path):
    runs = tmp_path / "runs"
    done = run_launcher(["--cluster", "ray", "--nodes", "2", "--gpus", "1", f"output_dir={runs}", *QUICK,
                         "trainer.steps=1000000", "wandb.mode=disabled"], cwd=tmp_path, timeout=150,
                        env={**ray_env(ray2), **SLOW_FROM_10})  # from step 10 on it idles until cancelled
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = only_dir(runs)
    assert f"submitted Ray job {run_dir.name}" in done.stdout and f"python -m launcher cancel {run_dir}" in done.stdout
    rank0 = run_dir / "logs" / "rank-0.log"
    try:
        wait_for(lambda: rank0.is_file() and "step 10/" in rank0.read_text(errors="replace"), 150, "training to start")
        status = run_launcher(["status", str(run_dir)], cwd=tmp_path, timeout=60)
        assert status.returncode == 0 and "RUNNING" in status.stdout, status.stdout + status.stderr
        logs = run_launcher(["logs", run_dir.name, "--output-dir", str(runs), "--rank", "1"], cwd=tmp_path, timeout=60)
        assert logs.returncode == 0 and "rank 1/2 (node 1" in logs.stdout, logs.stdout[-2000:] + logs.stderr
    finally:
        cancel = run_launcher(["cancel", str(run_dir)], cwd=tmp_path, timeout=120)
    assert cancel.returncode == 0 and f"cancelled Ray job {run_dir.name}" in cancel.stdout, cancel.stdout + cancel.stderr
    status = run_launcher(["status", str(run_dir)], cwd=tmp_path, timeout=60)
    assert status.returncode == 130 and "CANCELLED" in status.stdout, status.stdout + status.stderr
    assert read_summary(run_dir)["status"] == "interrupted"
    assert ray2.leftovers() == {"placement_groups": [], "actors": []}


# Two rounds are one of each shape (a --wait launch, then a cancel); LAUNCHER_STRESS_ROUNDS=50 for the long run
ROUNDS = int(os.environ.get("LAUNCHER_STRESS_ROUNDS", "2"))


@pytest.mark.timeout(240 + 120 * ROUNDS)
def test_launches_in_a_row_all_end_and_leave_nothing_on_the_cluster(ray2, tmp_path):
    """A bounded repetition of bench/ray_stress.py (50 launches there): --wait launches and a cancel. A --wait launch
    prints rank 0's lines as they come: within 2 s of its node's launcher getting each (it was silent for 51 s)."""
    for k in range(1, ROUNDS + 1):
        r = launch_once(k, cancel=k % 3 == 2, root=tmp_path, cluster=ray2, timeout=120)
        assert r["ok"], line(r) + "\n" + r["tail"]
        if r["kind"] == "wait":
            assert len(r["late_s"]) >= 3 and max(r["late_s"]) < 2.0, r["late_s"]
