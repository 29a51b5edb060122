"""What the command line tells a user about itself: the top-level --help lists every subcommand, each subcommand
has its own --help, --version names the versions, and a mistyped subcommand gets "did you mean". All through
`python -m launcher` for real; nothing here starts a run."""

import json
import re
import sys
import time
from importlib import metadata

import pytest

from launcher.cli import COMMANDS
from tests.helpers import run_launcher

pytestmark = pytest.mark.timeout(300)


def test_the_top_level_help_lists_every_subcommand_with_one_line_and_the_run_options(tmp_path):
    result = run_launcher(["--help"], cwd=tmp_path, timeout=60)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    text = result.stdout
    for name in COMMANDS:  # the table, so a subcommand added later is checked too
        line = next((line for line in text.splitlines() if re.match(rf"  {name} +\S", line)), None)
        assert line is not None, f"`{name}` has no line of its own in --help:\n{text}"
        assert len(line.split(None, 1)[1]) > 10, line  # a description, not just the name
    for option in ("--nodes", "--gpus", "--config", "--cluster", "--dry-run", "--show-config", "--version"):
        assert option in text, option
    assert "examples:" in text


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_subcommand_has_its_own_help(name, tmp_path):
    result = run_launcher([name, "--help"], cwd=tmp_path, timeout=60)
    assert result.returncode == 0, (result.stdout, result.stderr)
    first = result.stdout.splitlines()[0]
    assert first.startswith(f"usage: python -m launcher {name}"), result.stdout[:500]
    assert "commands (python -m launcher COMMAND --help" not in result.stdout  # not the top-level help


def test_version_names_the_package_and_torch_from_their_metadata_quickly(tmp_path):
    started = time.monotonic()
    result = run_launcher(["--version"], cwd=tmp_path, timeout=60)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.splitlines() == [line]
    assert line.startswith(f"torch-launcher {metadata.version('torch-launcher')} ")
    assert f"torch {metadata.version('torch')}" in line and f"Python {sys.version.split()[0]}" in line
    assert took < 10, f"--version took {took:.1f}s"  # about 0.3s alone; the bound leaves room for a loaded machine


@pytest.mark.parametrize("typo, meant", [("lss", "ls"), ("stauts", "status"), ("sweeep", "sweep"), ("comapre", "compare")])
def test_a_mistyped_subcommand_gets_did_you_mean_in_one_line(typo, meant, tmp_path):
    result = run_launcher([typo, "--gpus", "2"], cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"did you mean {meant}?" in lines[0], result.stderr
    assert not (tmp_path / "launcher_runs").exists()


def test_a_real_script_named_like_a_subcommand_still_runs(tmp_path):
    (tmp_path / "lss").write_text("import sys\nprint('the script ran', sys.argv[1:])\n")
    first = run_launcher(["lss", "--flag"], cwd=tmp_path, timeout=180)  # first on the line, where a typo would be
    assert "did you mean" not in first.stderr, first.stderr
    assert first.returncode == 0, first.stderr[-2000:]
    log = "".join(p.read_text() for p in (tmp_path / "launcher_runs").rglob("rank-0.log"))
    assert "the script ran ['--flag']" in log, log


def test_words_far_from_any_subcommand_are_left_to_the_run_command(tmp_path):
    result = run_launcher(["train"], cwd=tmp_path, timeout=60)  # no such script: the run command's own message
    assert result.returncode == 2 and "did you mean" not in result.stderr
    assert "train does not exist" in result.stderr, result.stderr


def test_slurm_and_ray_outcomes_print_the_final_loss_rounded_as_everywhere_else(tmp_path):
    """status's line for a finished SLURM or Ray job, from the run's summary.json (no scheduler needed for that)."""
    from launcher.backends.ray import records as ray_records
    from launcher.backends.slurm import records as slurm_records

    (tmp_path / "summary.json").write_text(json.dumps(
        {"status": "completed", "steps": 50, "world_size": 4, "final_loss": 2.180667817592621, "restarts": 0}))
    slurm = slurm_records.outcome_line(tmp_path, {"job_id": "12"}, "COMPLETED")
    ray = ray_records.outcome_line(tmp_path, {"run_id": "r"}, "COMPLETED")
    for line in (slurm, ray):
        assert "final loss 2.1807," in line and "2.18066" not in line, line
