"""Bad invocations across every command: one line naming the problem and the fix, a non-zero exit,
no traceback, and no change to the run directories that already exist."""

import hashlib

import pytest

from tests.forked_cli import ForkedCli
from tests.helpers import QUIET, only_run_dir, run_launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def snapshot(root):
    """Every file under root with its size and content hash."""
    return {str(p.relative_to(root)): (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*")) if p.is_file()}


def cases(run, runs, tmp_path):
    """(argv, words the one line must contain). `run` is a finished run; `runs` its output_dir."""
    out = f"output_dir={runs}"
    return [
        # launch flags
        (["--nodes", "x", out], "--nodes expects a whole number"),
        (["--gpus", "-3", out], "--gpus=-3 must be at least 1"),
        (["--max-restarts", "-1", out], "launcher.max_restarts=-1 must be at least 0"),
        (["--rdzv-timeout", "0", out], "rdzv.timeout_s=0 must be at least 1"),
        (["--nodes", "2", "--node-rank", "5", "--master-addr", "127.0.0.1", "--master-port", "29511", out], "number the machines 0..1"),
        (["--nodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", "70000", out], "outside 1..65535"),
        (["--nodes", "2", "--node-rank", "0", "--master-addr", "no.such.host.invalid", "--master-port", "29512", out], "does not resolve"),
        (["--wait", out], "add --cluster slurm"),
        # config keys and values
        (["--config", str(tmp_path / "none.yaml"), out], "no such file"),
        (["model.name=resnet9000", out], "model.name=resnet9000 is not one of"),
        (["trainer.strategy=pipeline", "trainer.pipeline.stages=9", out], "raise model.depth"),
        (["trainer.precision=fp16", out], "use trainer.precision=bf16"),
        (["trainer.grad_accum_steps=0", out], "trainer.grad_accum_steps=0 must be at least 1"),
        (["checkpoint.keep=0", out], "checkpoint.keep=0 must be at least 1"),
        (["watchdog.timeout_s=-1", out], "or 0 to disable"),
        (["metrics.straggler_fraction=0", out], "must be positive"),
        # script paths
        (["nosuchscript.py", out], "does not exist"),
        ([str(tmp_path), out], "is a directory"),
        # SLURM options
        (["cluster=k8s", out], "cluster=k8s is not one of"),
        (["--cluster", "slurm", "slurm.time_min=0", out], "slurm.time_min=0 must be at least 1"),
        (["--cluster", "slurm", "slurm.gpus=maybe", out], "slurm.gpus=maybe is not one of"),
        # run ids that do not exist, directories that are not ours, refused resumes
        (["resume", str(runs / "does-not-exist")], "pass a run directory or a run id"),
        (["resume", str(tmp_path / "notours")], "is not a launcher run directory"),
        (["resume", str(run), "model.hidden=8"], "model.hidden"),
        (["resume", str(run), "trainer.steps=abc"], "trainer.steps"),
        (["resume", str(run), "trainer.stepz=9"], "cannot change on resume"),
        (["status", "99999999", "--output-dir", str(runs)], "pass a run directory, a run id"),
        (["logs", str(tmp_path / "notours")], "pass a run directory, a run id"),
        (["cancel", "does-not-exist", "--output-dir", str(runs)], "pass a run directory, a run id"),
        # other commands
        (["compare", "--gpus", "2", "strategies=ddp,warp", out], "choose from"),
        (["scale", "--gpus", "0", out], "every size must be at least 1"),
        (["scale", "--gpus", "1,2", "--mode", "sideways", out], "invalid choice: 'sideways'"),
        (["scale", "--gpus", "1,2", "--rounds", "3", "--max-rounds", "2", out], "need 1 <= rounds <= max-rounds"),
        (["scale", "--gpus", "1,2", "--spread", "0", out], "must be a positive fraction"),
        (["doctor", "--bogus"], "unrecognized arguments: --bogus"),
        (["doctor", "--comm", "--gpus", "0"], "needs at least 1 node and 1 worker"),
    ]


def test_every_bad_invocation_is_one_line_and_changes_nothing(tmp_path):
    runs = tmp_path / "runs"
    done = run_launcher(["--gpus", "2", f"output_dir={runs}", "trainer.steps=4", "checkpoint.every_steps=2", *QUIET], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run = only_run_dir(runs)
    (tmp_path / "notours").mkdir()
    (tmp_path / "notours" / "model.pt").write_text("not a checkpoint of ours")
    before, theirs = snapshot(runs), snapshot(tmp_path / "notours")

    all_cases = cases(run, runs, tmp_path)
    assert len(all_cases) >= 25
    with ForkedCli(tmp_path) as cli:  # each case a real launcher process, forked after its imports
        results = [(argv, words, cli.run(argv, cwd=tmp_path)) for argv, words in all_cases]
    for argv, words, result in results:
        lines = result.stderr.strip().splitlines()
        assert result.returncode != 0, (argv, result.stdout, result.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, result.stderr)
        assert words in lines[0], (argv, lines[0])
        assert "Traceback" not in result.stdout + result.stderr, argv
    assert snapshot(runs) == before, "a bad invocation changed an existing run directory"
    assert snapshot(tmp_path / "notours") == theirs
