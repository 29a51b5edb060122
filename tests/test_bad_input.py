"""Bad input: one line naming the problem and the fix, exit code 2, no traceback, nothing started."""

import pytest

from tests.helpers import run_launcher

pytestmark = pytest.mark.timeout(60)


def cases(tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("trainer: [unclosed\n")
    unreadable = tmp_path / "binary.yaml"
    unreadable.write_bytes(b"\xff\xfe\x00bad")
    (tmp_path / "adir").mkdir()
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    return [
        (["--nodes", "0"], "--nodes=0 must be at least 1"),
        (["--gpus", "0"], "--gpus=0 must be at least 1"),
        (["--gpus", "two"], "--gpus expects a whole number, got 'two'"),
        (["--nodes", "1.5"], "--nodes expects a whole number"),
        (["gpus=-1"], "--gpus=-1 must be at least 1"),
        (["trainer.nosuch=1"], "unknown config key 'trainer.nosuch'"),
        (["trainer.steps=many"], "wrong type for 'trainer.steps'"),
        (["--config", str(tmp_path / "missing.yaml")], "no such file"),
        (["--config", str(bad_yaml)], "not valid YAML"),
        (["--config", str(unreadable)], str(unreadable)),
        (["--config", str(tmp_path / "adir")], "is a directory"),
        (["missing_script.py"], "script missing_script.py does not exist"),
        (["adir"], "script adir is a directory"),
        ([f"output_dir={a_file}/sub"], "cannot be written"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["checkpoint.keep=0"], "checkpoint.keep=0 must be at least 1"),
        (["checkpoint.every_steps=-5"], "checkpoint.every_steps=-5 must be at least 0"),
        (["checkpoint.grace_s=60"], "checkpoint.grace_s=60.0 must be in (0, 12]"),
    ]


def test_each_bad_input_gives_one_line_and_exit_2(tmp_path):
    out = tmp_path / "runs"
    for argv, words in cases(tmp_path):
        base = [] if any(a.startswith("output_dir=") for a in argv) else [f"output_dir={out}"]
        result = run_launcher([*base, *argv], cwd=tmp_path, timeout=30)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (argv, result.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, result.stderr)
        assert words in lines[0], (argv, lines[0])
        assert "Traceback" not in result.stderr + result.stdout
        assert not out.exists(), f"{argv} created a run directory"
