"""A user's own torchrun-style script runs unchanged, with torchrun's environment contract."""

import json
import textwrap

import pytest

from tests.helpers import NO_WANDB, only_run_dir, read_summary, run_launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

CONTRACT = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "ROLE_RANK", "ROLE_WORLD_SIZE", "OMP_NUM_THREADS"]

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    from helper_mod import TAG          # a local import next to the script

    out = sys.argv[sys.argv.index("--out") + 1]
    dist.init_process_group("gloo")
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    record = {k: os.environ.get(k) for k in %r}
    record.update(argv=sys.argv, name=__name__, file=__file__, tag=TAG, allreduce=t.item())
    with open(os.path.join(out, "env-%%s.json" %% os.environ["RANK"]), "w") as f:
        json.dump(record, f)
    dist.destroy_process_group()
""" % (CONTRACT,))


def write_script(where):
    (where / "train.py").write_text(SCRIPT)
    (where / "helper_mod.py").write_text("TAG = 'local-import-ok'\n")


def check_contract(out, workers, argv_tail):
    records = [json.loads((out / f"env-{r}.json").read_text()) for r in range(workers)]
    assert sorted(int(r["RANK"]) for r in records) == list(range(workers))
    for r in records:
        assert all(r[k] is not None for k in CONTRACT), r
        assert int(r["WORLD_SIZE"]) == workers and int(r["LOCAL_WORLD_SIZE"]) == workers
        assert r["LOCAL_RANK"] == r["RANK"] and r["GROUP_RANK"] == "0"
        assert r["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert r["name"] == "__main__" and r["tag"] == "local-import-ok"
        assert r["argv"][1:] == argv_tail
        assert r["allreduce"] == sum(range(1, workers + 1))
    assert len({r["TORCHELASTIC_RUN_ID"] for r in records}) == 1
    return records


@pytest.mark.compat
def test_script_gets_torchruns_contract_and_its_arguments(tmp_path):
    write_script(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    result = run_launcher(["--gpus", "2", f"output_dir={tmp_path / 'runs'}", *NO_WANDB, "train.py", "--lr", "0.1", "--out", str(out)],
                          cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    records = check_contract(out, 2, ["--lr", "0.1", "--out", str(out)])
    assert records[0]["argv"][0] == "train.py" and records[0]["file"].endswith("train.py")
    summary = read_summary(only_run_dir(tmp_path / "runs"))
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["script"] == "train.py"


def test_module_form_runs_like_python_dash_m(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    write_script(tmp_path)
    (pkg / "train.py").write_text((tmp_path / "train.py").read_text())
    out = tmp_path / "out"
    out.mkdir()
    result = run_launcher(["--gpus", "2", f"output_dir={tmp_path / 'runs'}", *NO_WANDB, "-m", "mypkg.train", "--out", str(out)],
                          cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    check_contract(out, 2, ["--out", str(out)])


@pytest.fixture(scope="module")
def late_failure(tmp_path_factory):
    """Rank 0 finishes, rank 1 raises 1.5 s later: the failing run both failure-line tests read (one launch)."""
    tmp_path = tmp_path_factory.mktemp("late-failure")
    (tmp_path / "bad.py").write_text(textwrap.dedent("""
        import os, time
        if os.environ["RANK"] == "1":
            time.sleep(1.5)
            raise ValueError("boom on purpose")
    """))
    result = run_launcher(["--gpus", "2", f"output_dir={tmp_path / 'runs'}", *NO_WANDB, "bad.py"], cwd=tmp_path)
    return result, only_run_dir(tmp_path / "runs")


def test_failing_script_names_the_rank_and_error(late_failure):
    result, run_dir = late_failure
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: rank 1 failed") and "ValueError: boom on purpose" in last, result.stderr
    assert read_summary(run_dir)["status"] == "failed"
    assert "ValueError: boom on purpose" in (run_dir / "logs" / "rank-1.log").read_text()
    assert "Traceback" in result.stdout + result.stderr  # the worker's own crash output reaches the console


def test_script_exit_code_is_reported(tmp_path):
    (tmp_path / "exit3.py").write_text("import sys, os\nsys.exit(3 if os.environ['RANK'] == '0' else 0)\n")
    result = run_launcher(["--gpus", "2", f"output_dir={tmp_path / 'runs'}", *NO_WANDB, "exit3.py"], cwd=tmp_path)
    assert result.returncode == 1
    assert "rank 0 failed: exit code 3" in result.stderr


def test_a_rank_that_hangs_at_exit_after_its_script_returned_is_named_killed_and_the_job_completes(tmp_path):
    """The exit-hang bound: the script's own result stands (exit 0), the rank is named, nothing is left."""
    (tmp_path / "exit_hang.py").write_text(textwrap.dedent("""
        import atexit, os, time
        import torch.distributed as dist
        dist.init_process_group("gloo")
        dist.barrier()
        dist.destroy_process_group()
        if os.environ["RANK"] == "1":
            atexit.register(time.sleep, 3600)  # the interpreter's exit never ends
    """))
    result = run_launcher(["--gpus", "2", f"output_dir={tmp_path / 'runs'}", *NO_WANDB, "launcher.exit_timeout_s=3",
                           "exit_hang.py"], cwd=tmp_path, timeout=90)
    assert result.returncode == 0, result.stderr
    assert "rank 1 finished its script (exit code 0) but its process did not exit within 3s" in result.stderr
    summary = read_summary(only_run_dir(tmp_path / "runs"))
    assert summary["status"] == "completed" and summary["ranks_killed_at_exit"] == [1]


def test_a_script_restarted_after_a_failure_counts_its_restarts_and_promises_no_checkpoint(tmp_path):
    (tmp_path / "flaky.py").write_text(textwrap.dedent("""
        import os, sys
        if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
            sys.exit(7)
    """))
    result = run_launcher(["--gpus", "2", f"output_dir={tmp_path / 'runs'}", *NO_WANDB, "--max-restarts", "1",
                           "flaky.py"],
                          cwd=tmp_path, timeout=90)
    assert result.returncode == 0, result.stderr
    assert "rank 1 failed: exit code 7" in result.stderr and "your script starts again from its beginning" in result.stderr
    assert "checkpoint" not in result.stderr
    assert read_summary(only_run_dir(tmp_path / "runs"))["restarts"] == 1


def test_the_failure_line_names_only_ranks_that_failed_on_their_own(late_failure):
    """Rank 0 finishes, rank 1 fails later: rank 0 is not 'failed too'."""
    result, _ = late_failure
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: rank 1 failed: exit code 1: ValueError: boom on purpose"), last
    assert "failed too" not in last


def test_stdout_and_stderr_stay_apart_and_a_progress_bar_keeps_its_lines(tmp_path):
    (tmp_path / "streams.py").write_text(textwrap.dedent("""
        import sys, time
        print("to-stdout")
        print("to-stderr", file=sys.stderr)
        for i in range(3):
            sys.stderr.write(f"\\rprogress {i}/3")
            sys.stderr.flush()
            time.sleep(0.05)
        sys.stderr.write("\\n")
        print("[rank0]:[W torch-style warning]", file=sys.stderr)
    """))
    result = run_launcher(["--gpus", "1", f"output_dir={tmp_path / 'runs'}", *NO_WANDB, "streams.py"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "[rank0]: to-stdout" in result.stdout and "to-stderr" not in result.stdout
    assert "[rank0]: to-stderr" in result.stderr and "to-stdout" not in result.stderr
    assert "[rank0]: progress 2/3\n" in result.stderr  # whole segments, each with one prefix
    assert "[rank0]: [rank0]:" not in result.stderr and "[rank0]:[W torch-style warning]" in result.stderr
    log = (only_run_dir(tmp_path / "runs") / "logs" / "rank-0.log").read_bytes()
    assert b"to-stdout" in log and b"to-stderr" in log and b"\rprogress 1/3" in log  # the log is byte for byte
