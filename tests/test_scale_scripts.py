"""`scale` with a user's script: its arguments pass through untouched, it runs unchanged at every size, and the
sweep reports steps/s and samples/s with the batch it measured (weak, strong or mixed scaling)."""

import json
import shutil

import pytest
import torch

from launcher.commands.scale import build_points, parse_request, script_argv
from launcher.commands.scale_report import render_markdown
from launcher.commands.scale_script import SCRIPT_COLUMNS, batch_check, footnote, script_rows
from launcher.errors import ConfigError
from launcher.usage import parse_args, script_spec
from tests.helpers import REPO, only_run_dir, read_summary, run_launcher

pytestmark = pytest.mark.timeout(420)

SCRIPT = REPO / "tests" / "scripts" / "ddp_loader.py"
TOO_MANY = "but CUDA shows" if torch.cuda.is_available() else "4000 CPU workers on this machine"


# --- the command line: pure mapping, no process -------------------------------------------------------------

def test_the_script_and_every_argument_after_it_are_the_scripts():
    args, script = parse_request(["--gpus", "1,2", "seed=3", "train.py", "--lr", "0.1", "--gpus", "8",
                                  "--mode", "strong", "trainer.steps=9", "--", "-m"])
    assert (args.gpus, args.nodes, args.mode, args.overrides) == ("1,2", "1", "weak", ["seed=3"])
    assert script == ("train.py", False, ["--lr", "0.1", "--gpus", "8", "--mode", "strong", "trainer.steps=9", "--", "-m"])
    args, module = parse_request(["--nodes", "1,2", "--gpus", "1", "-m", "pkg.train", "--epochs", "1"])
    assert (args.nodes, module) == ("1,2", ("pkg.train", True, ["--epochs", "1"]))
    assert parse_request(["--gpus", "1,2", "trainer.steps=5"]) [1] is None  # the built-in trainer: strong by default
    assert parse_request(["--gpus", "1,2"])[0].mode == "strong"


@pytest.mark.parametrize("script", [("train.py", False, ["--lr", "0.1", "run_id=x", "--gpus", "3", "--"]),
                                    ("a=b.py", False, []),  # a name shaped like an override stays the script
                                    ("pkg.train", True, ["-m", "--epochs", "1"])])
def test_a_childs_command_line_gives_the_run_command_the_same_script(script):
    ours = ["--nodes", "2", "--gpus", "1", "seed=1", "output_dir=/tmp/x", "run_id=n2-g1"]
    args, rest = parse_args(ours + script_argv(script))
    assert script_spec(args, rest) == script and args.overrides == ours[4:] and (args.nodes, args.gpus) == (2, 1)


def test_strong_mode_is_refused_for_a_script_with_the_reason():
    with pytest.raises(ConfigError, match="cannot set a script's batch.*drop --mode"):
        parse_request(["--gpus", "1,2", "--mode", "strong", "train.py"])
    assert parse_request(["--gpus", "1,2", "--mode", "weak", "train.py"])[0].mode == "weak"


# --- the figures: pure, from made-up summaries ----------------------------------------------------------------

def _summary(world: int, steps: float, samples, batch):
    return {"world_size": world, "steps_per_s": steps, "samples_per_s": samples, "global_batch_size": batch,
            "step_time_s_median": 1 / steps, "rss_peak_mb": 300.0,
            "samples_note": None if samples else "the loop iterates no DataLoader"}


def test_weak_script_efficiency_from_samples_and_the_batch_it_measured():
    points = build_points([1, 2, 4], [1], "weak", None)
    rounds = [[_summary(1, 10.0, 160.0, 16)], [_summary(2, 9.0, 288.0, 32), _summary(2, 8.0, 256.0, 32)],
              [_summary(4, 8.0, 512.0, 64)]]
    one, two, four = script_rows(points, rounds)
    assert [r["batch_per_worker"] for r in (one, two, four)] == [16.0, 16.0, 16.0]
    assert two["samples_per_s"] == pytest.approx(272.0) and two["steps_per_s"] == pytest.approx(8.5)
    assert two["scaling_efficiency"] == pytest.approx(272 / 320) and four["scaling_efficiency"] == pytest.approx(0.8)
    assert four["speedup"] == pytest.approx(3.2) and two["spread"] == pytest.approx(32 / 272)
    assert all(r["efficiency_from"] == "samples_per_s" for r in (one, two, four))
    assert batch_check([one, two, four]) == ("weak", None)
    md = render_markdown({"mode": "weak", "script": "train.py", "efficiency_from": "samples_per_s",
                          "device_type": "cpu", "sizes": [one, two, four]}, SCRIPT_COLUMNS, footnote("samples_per_s"))
    assert "(train.py: weak scaling, cpu, efficiency from samples/s)" in md
    assert "| 2 | 1 | 2 | 16 | 32 | 8.5 | 12% | 272 | 12% |" in md  # (largest - smallest) / median, as --spread


def test_without_samples_efficiency_is_from_steps_and_says_what_it_assumes():
    points = build_points([1, 2], [1], "weak", None)
    rows = script_rows(points, [[_summary(1, 10.0, None, None)], [_summary(2, 9.0, None, None)]])
    assert rows[1]["scaling_efficiency"] == pytest.approx(0.9) and rows[1]["speedup"] == pytest.approx(1.8)
    assert rows[1]["efficiency_from"] == "steps_per_s" and rows[1]["samples_per_s"] is None
    mode, note = batch_check(rows)
    assert mode == "weak" and "could not be read at 1, 2 worker(s) (the loop iterates no DataLoader)" in note
    assert "steps/s_N / steps/s_N0" in footnote("steps_per_s")


def test_a_script_that_divides_its_global_batch_is_strong_scaling_and_one_that_changes_both_is_mixed():
    points = build_points([1, 2], [1], "weak", None)
    strong = script_rows(points, [[_summary(1, 10.0, 320.0, 32)], [_summary(2, 18.0, 576.0, 32)]])
    assert [r["batch_per_worker"] for r in strong] == [32.0, 16.0]
    assert strong[1]["scaling_efficiency"] == pytest.approx(0.9)  # samples/s at a fixed global batch
    mode, note = batch_check(strong)
    assert mode == "strong" and "keeps its global batch (32 samples per step" in note and "32 -> 16" in note
    mixed = script_rows(points, [[_summary(1, 10.0, 320.0, 32)], [_summary(2, 10.0, 480.0, 48)]])
    assert batch_check(mixed)[0] == "mixed"
    short = script_rows(points, [[_summary(1, 10.0, 160.0, 16)], [_summary(2, 10.0, 310.0, 31)]])
    assert batch_check(short) == ("weak", None)  # 15.5 vs 16: an epoch's short last batch, not another batch


# --- real sweeps ----------------------------------------------------------------------------------------------

def _sweep(tmp_path, sizes, script_args=(), overrides=()):
    """A one-round sweep of ddp_loader.py --epochs 1 (with script_args) at sizes: (its output, folder, scale.json)."""
    shutil.copy(SCRIPT, tmp_path / "ddp_loader.py")
    out = tmp_path / "out"
    out.mkdir()
    result = run_launcher(["scale", *sizes, "--rounds", "1", "--max-rounds", "1", f"output_dir={tmp_path / 'runs'}",
                           "wandb.group=script-sweep", *overrides, "ddp_loader.py", "--out", str(out), "--epochs", "1",
                           *script_args], cwd=tmp_path, timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep = only_run_dir(tmp_path / "runs")
    return result, sweep, json.loads((sweep / "scale.json").read_text())


def _agrees_with_the_runs(sweep, scale, names):
    summaries = [read_summary(sweep / "runs" / name) for name in names]
    base = summaries[0]
    for row, summary in zip(scale["sizes"], summaries):
        assert summary["script"] == "ddp_loader.py" and summary["world_size"] == row["world_size"]
        assert row["steps_per_s"] == summary["steps_per_s"] > 0 and row["samples_per_s"] == summary["samples_per_s"] > 0
        assert row["global_batch"] == summary["global_batch_size"] and row["efficiency_from"] == "samples_per_s"
        ideal = base["samples_per_s"] * row["world_size"] / scale["sizes"][0]["world_size"]
        assert row["scaling_efficiency"] == pytest.approx(summary["samples_per_s"] / ideal)
    return summaries


def test_a_script_sweep_runs_it_unchanged_at_every_size(tmp_path):
    result, sweep, scale = _sweep(tmp_path, ["--gpus", "1,2"])
    assert (scale["mode"], scale["script"], scale["efficiency_from"]) == ("weak", "ddp_loader.py", "samples_per_s")
    assert [r["world_size"] for r in scale["sizes"]] == [1, 2] and scale["batch_note"] is None
    summaries = _agrees_with_the_runs(sweep, scale, ["n1-g1", "n1-g2"])
    assert [r["batch_per_worker"] for r in scale["sizes"]] == [16.0, 16.0]  # the script's BATCH, on every worker
    assert [s["steps"] for s in summaries] == [64, 32]  # one epoch of 1024 samples, split by its DistributedSampler
    plan = json.loads((sweep / "runs" / "n1-g2" / "plan.json").read_text())
    assert plan["command"][1:] == ["ddp_loader.py", "--out", str(tmp_path / "out"), "--epochs", "1"]
    assert (sweep / "scale.png").read_bytes()[:4] == b"\x89PNG"
    assert "| workers |" in (sweep / "scale.md").read_text() and "steps/s" in (sweep / "scale.md").read_text()
    assert "efficiency from samples/s" in result.stdout
    assert len(list((sweep / "wandb").glob("offline-run-*"))) == 1  # the sweep's own run, with the table
    for name in ("n1-g1", "n1-g2"):  # and each size's own run, in the sweep's group
        (run,) = (sweep / "runs" / name / "wandb").glob("offline-run-*/*.wandb")
        assert b"script-sweep" in run.read_bytes()


def test_a_node_sweep_of_a_script_that_keeps_its_global_batch_is_reported_as_strong(tmp_path):
    # no W&B: the sweep above checks its runs (three offline runs cost ~3 CPU-s each)
    result, sweep, scale = _sweep(tmp_path, ["--nodes", "1,2", "--gpus", "1"], ["--global-batch", "32"],
                                  ["wandb.mode=disabled"])
    assert [(r["nodes"], r["gpus_per_node"]) for r in scale["sizes"]] == [(1, 1), (2, 1)]
    _agrees_with_the_runs(sweep, scale, ["n1-g1", "n2-g1"])
    assert [r["batch_per_worker"] for r in scale["sizes"]] == [32.0, 16.0]
    assert [r["global_batch"] for r in scale["sizes"]] == [32, 32]
    assert scale["mode"] == "strong" and "strong scaling, not weak" in scale["batch_note"]
    assert "strong scaling, not weak" in result.stdout and "strong scaling, not weak" in (sweep / "scale.md").read_text()


@pytest.mark.parametrize("args, words", [
    (["--gpus", "1,,2", "ddp_loader.py"], "--gpus 1,,2: an empty size between commas"),
    # the run's own check of what this machine can run (not the built-in trainer's data.dataset_size)
    (["--gpus", "4000", "ddp_loader.py"], f"scale: at 4000 worker(s) (1 node(s) x 4000): {TOO_MANY}"),
    # beyond any machine: the bound on --gpus
    (["--gpus", "100000", "ddp_loader.py"], "scale: at 100000 worker(s) (1 node(s) x 100000): --gpus=100000 is out of range"),
    (["--gpus", "1,100000", "--mode", "weak"], "scale: at 100000 worker(s)"),  # the built-in trainer too
    (["--gpus", "1,2", "nosuchscript.py", "--epochs", "1"], "script nosuchscript.py does not exist"),
    (["--gpus", "1,2", "--mode", "strong", "ddp_loader.py"], "cannot set a script's batch"),
])
def test_bad_script_sweeps_are_one_line_and_make_nothing(tmp_path, args, words):
    shutil.copy(SCRIPT, tmp_path / "ddp_loader.py")
    result = run_launcher(["scale", f"output_dir={tmp_path / 'runs'}", *args], cwd=tmp_path, timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and words in lines[0], result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp_loader.py"]  # no sweep folder, no output_dir
