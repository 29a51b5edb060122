"""Secrets stay out of a run's records, and its files follow the user's umask.

Units for the redaction mapping (pure), then one real run: a script that writes the argv it
received, launched under umask 027 with secret-looking arguments.
"""

from __future__ import annotations

import json
import stat
import sys

import pytest

from launcher.config.schema import load_config, to_dict, to_yaml
from launcher.config.secrets import REDACTED, redact
from launcher.runtime.config import config_record
from tests.helpers import REPO, only_run_dir, run_bounded

WANDB_LIKE = "0123456789abcdef0123456789abcdef01234567"  # the shape of a W&B API key
ARGV = ["--api-key", "k-one", "--token=k-two", "AWS_SECRET_KEY=k-three", "HF_TOKEN=k-four", "--password", "k-five",
        "--lr", "0.1", WANDB_LIKE, "AKIAABCDEFGHIJKLMNOP", "--keep", "3", "--epochs", "2"]
SECRETS = ["k-one", "k-two", "k-three", "k-four", "k-five", WANDB_LIKE, "AKIAABCDEFGHIJKLMNOP"]


def test_script_arguments_are_redacted_and_the_rest_kept():
    assert redact(ARGV) == ["--api-key", REDACTED, "--token=" + REDACTED, "AWS_SECRET_KEY=" + REDACTED,
                            "HF_TOKEN=" + REDACTED, "--password", REDACTED, "--lr", "0.1", REDACTED, REDACTED,
                            "--keep", "3", "--epochs", "2"]
    assert redact(("python", "train.py", "--token", "x")) == ("python", "train.py", "--token", REDACTED)


def test_config_keys_and_key_shaped_values_are_redacted():
    record = redact({"wandb_api_key": "x", "aws_access_key": "y", "keep": 3, "extra": {"comment": WANDB_LIKE},
                     "monkey": "z", "empty_token": ""})
    assert record == {"wandb_api_key": REDACTED, "aws_access_key": REDACTED, "keep": 3,
                      "extra": {"comment": REDACTED}, "monkey": "z", "empty_token": ""}


def test_the_w_and_b_record_and_config_yaml_hold_no_secret():
    cfg = load_config(None, [f"slurm.extra={{comment: {WANDB_LIKE}}}", "wandb.tags=[ok,hf_abcdefghijklmnopqrstuvwx]"])
    assert WANDB_LIKE in json.dumps(to_dict(cfg))  # the job itself gets the real values
    for text in (json.dumps(config_record(cfg)), to_yaml(cfg)):
        assert WANDB_LIKE not in text and "hf_abcdefghijklmnopqrstuvwx" not in text and "ok" in text


@pytest.mark.timeout(180)
def test_a_real_run_records_no_secret_gives_the_script_its_argv_and_follows_the_umask(tmp_path):
    script = tmp_path / "argv.py"
    script.write_text("import json, os, sys\n"
                      "if os.environ['RANK'] == '0':\n"
                      "    open(os.environ['ARGV_OUT'], 'w').write(json.dumps(sys.argv[1:]))\n")
    out, got = tmp_path / "runs", tmp_path / "argv.json"
    launch = [sys.executable, "-m", "launcher", "--gpus", "2", f"output_dir={out}", str(script), *ARGV]
    result = run_bounded(["sh", "-c", 'umask 027 && exec "$@"', "sh", *launch], cwd=REPO, timeout=150,
                         env={"ARGV_OUT": str(got)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(got.read_text()) == ARGV  # the script still receives its real arguments
    run_dir = only_run_dir(out)
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    for path in files:
        text = path.read_text(errors="replace")
        assert not [s for s in SECRETS if s in text], f"{path} holds a secret"
    assert json.loads((run_dir / "plan.json").read_text())["command"][2:4] == ["--api-key", REDACTED]
    for name in ("plan.json", "config.yaml", "summary.json"):
        mode = stat.S_IMODE((run_dir / name).stat().st_mode)
        assert mode == 0o640, f"{name} is {oct(mode)} under umask 027"
