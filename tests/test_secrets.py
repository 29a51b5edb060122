"""Secrets stay out of a run's records, and its files follow the user's umask.

Units for the redaction mapping (pure; a table of the forms redacted and of those kept), then real
runs: a script that writes the argv and environment it received, launched under umask 027 with
secret-looking arguments, overrides and environment values; and the same command's --dry-run print.
"""

from __future__ import annotations

import json
import stat
import sys

import pytest

from launcher.config.schema import load_config, to_dict, to_yaml
from launcher.config.secrets import REDACTED, redact, redact_text
from launcher.runtime.config import config_record
from tests.helpers import REPO, only_run_dir, run_bounded

WANDB_LIKE = "0123456789abcdef0123456789abcdef01234567"  # the shape of a W&B API key
ARGV = ["--api-key", "k-one", "--token=k-two", "AWS_SECRET_KEY=k-three", "HF_TOKEN=k-four", "--password", "k-five",
        "--lr", "0.1", WANDB_LIKE, "AKIAABCDEFGHIJKLMNOP", "--keep", "3", "--epochs", "2",
        "--auth", "k-six", "--auth=k-seven", "-k", "k-eight", "-p", "k-nine", "-P", "k-ten", "-pk-eleven",
        "--db", "postgres://u:k-twelve@db.example/prod", "--hub=https://user:k-thirteen@hub.example/x",
        "--repo", "https://Kfourteen0tokenXYZ@git.example/r.git",
        "-p", "/data/x", "-P", "8080", "-k", "./keys", "--mirror", "ssh://git@git.example/r.git"]
SECRETS = ["k-one", "k-two", "k-three", "k-four", "k-five", WANDB_LIKE, "AKIAABCDEFGHIJKLMNOP", "k-six", "k-seven",
           "k-eight", "k-nine", "k-ten", "k-eleven", "k-twelve", "k-thirteen", "Kfourteen0tokenXYZ"]
# Where else a secret can come in: an override (recorded in config.yaml and sent to W&B) and an environment
# variable the run's record keeps (env/<host>.json's distributed variables).
OVERRIDES = ["slurm.extra={comment: 'postgres://u:k-fifteen@h/db'}", "wandb.tags=[ok,https://u:k-sixteen@h]"]
ENV = {"TORCH_MIRROR_URL": "https://mirror:k-seventeen@mirror.example/simple"}
SECRETS += ["k-fifteen", "k-sixteen", "k-seventeen"]
# Secrets known only by their shape, in the places names do not tell: after `=` of an innocent flag, inside a list
# (an override, an argument), and a generated key with no known prefix (after `=`, or as a flag's next word).
GH, HF, OPENAI, AWS_ID = ("ghp_" + "a1B2c3D4e5" * 4, "hf_" + "Zy9Xw8Vu7T" * 3, "sk-proj-" + "Q1w2E3r4T5y6" * 2,
                          "AKIAQWERTYUIOPASDFGH")
RANDOM_KEYS = ["Zq8XmP3vR7tL2kW9nB4yH6jD1fG5sC0aE", "Vb7NqX2mK9pL4rT8wY3zH6jD1fG5sC0a", "wJ4lrXUt7FEMI/K7MDE9G+bPx2fiCYE3AMP6EK"]
SHAPED = ["--hub=" + HF, "--openai=" + OPENAI, "--aws-id=" + AWS_ID, "--pairs=a:" + GH + ",b:c",
          "--signing=" + RANDOM_KEYS[0], "--material", RANDOM_KEYS[1], "AWS_SECRET_ACCESS=" + RANDOM_KEYS[2]]
# What looks a little like a secret and is not: model names, paths, run ids, numbers, digests, versions.
KEPT = ["--model=meta-llama/Llama-3.1-8B-Instruct", "--tiny=TinyLlama/TinyLlama-1.1B-Chat-v1.0",
        "--data=/data/task-abcdefghijklmnopqrstuvwxyz", "--run=20261127-123456-a1b2c3", "--steps=100000000000000000000",
        "--sha256=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "--arch=ResNet50_ImageNet1K_V2",
        "--uuid=550e8400-e29b-41d4-a716-446655440000", "--name", "MyExperimentRun2024Final"]
SHAPED_OVERRIDES = [f"wandb.tags=[ok,{GH}]", f"wandb.group={RANDOM_KEYS[1][::-1]}"]
SECRETS += [GH, HF, OPENAI, AWS_ID, *RANDOM_KEYS, RANDOM_KEYS[1][::-1]]

# (argument list, what the records show): every form the records redact, and the look-alikes they keep.
FORMS = [
    (["--auth", "X"], ["--auth", REDACTED]),
    (["--auth=X"], ["--auth=" + REDACTED]),
    (["--basic-auth", "u:pw"], ["--basic-auth", REDACTED]),
    (["--author", "me"], ["--author", "me"]),  # not an auth flag
    (["-k", "X"], ["-k", REDACTED]),
    (["-p", "X"], ["-p", REDACTED]),
    (["-P", "X"], ["-P", REDACTED]),
    (["-p=X"], ["-p=" + REDACTED]),
    (["-pX"], ["-p" + REDACTED]),  # mysql's form
    (["-p", "/data/x"], ["-p", "/data/x"]),  # a path: -p is a path or a port for many tools
    (["-p", "./x"], ["-p", "./x"]),
    (["-p", "../x"], ["-p", "../x"]),
    (["-P", "~/x"], ["-P", "~/x"]),
    (["-p", "8080"], ["-p", "8080"]),  # a number: a port, a count
    (["-p", "0.5"], ["-p", "0.5"]),
    (["-p5432"], ["-p5432"]),
    (["-p=/data/x"], ["-p=/data/x"]),
    (["-k", "-v"], ["-k", "-v"]),  # -k as a switch, followed by another flag
    (["-k"], ["-k"]),
    (["-v", "X"], ["-v", "X"]),
    (["postgres://u:PASS@h/db"], ["postgres://u:" + REDACTED + "@h/db"]),
    (["https://user:token@host"], ["https://user:" + REDACTED + "@host"]),
    (["--db=mysql://root:PASS@h:3306/x"], ["--db=mysql://root:" + REDACTED + "@h:3306/x"]),
    (["redis://:PASS@h:6379"], ["redis://:" + REDACTED + "@h:6379"]),  # no user, a password
    (["https://ghp_abcdefghijklmnopqrstuvwxyz@github.com/o/r"], ["https://" + REDACTED + "@github.com/o/r"]),
    (["https://AbC123xyzTOKEN@host/r.git"], ["https://" + REDACTED + "@host/r.git"]),  # a lone token
    (["https://a1b2c3d4e5f6@host/r"], ["https://" + REDACTED + "@host/r"]),  # lower case, but many digits
    (["ssh://git@github.com/o/r"], ["ssh://git@github.com/o/r"]),  # a lone login name stays
    (["ftp://anonymous@h/f"], ["ftp://anonymous@h/f"]),
    (["https://host/path@v2"], ["https://host/path@v2"]),  # an @ after the host is no userinfo
    (["https://host/x?q=a@b"], ["https://host/x?q=a@b"]),
    (["user@host:/path"], ["user@host:/path"]),  # scp's form: no scheme, no password
    # by shape alone: a known prefix wherever it stands, a generated-looking key as a value or after `=`
    (["--hub=" + HF], ["--hub=" + REDACTED]),
    (["wandb.tags=[ok," + GH + "]"], ["wandb.tags=[ok," + REDACTED + "]"]),
    (["--pairs=a:" + GH + ",b:c"], ["--pairs=a:" + REDACTED + ",b:c"]),
    (["--x=" + RANDOM_KEYS[0]], ["--x=" + REDACTED]),
    (["--x", RANDOM_KEYS[1]], ["--x", REDACTED]),
    (["--aws=" + RANDOM_KEYS[2]], ["--aws=" + REDACTED]),
    (["see " + OPENAI], ["see " + REDACTED]),
    (["--data=/data/task-abcdefghijklmnopqrstuvwxyz"], ["--data=/data/task-abcdefghijklmnopqrstuvwxyz"]),  # no sk- key
    *[([kept], [kept]) for kept in KEPT],
]


@pytest.mark.parametrize("argv,shown", FORMS, ids=[" ".join(f[0]) for f in FORMS])
def test_each_form_is_redacted_or_kept(argv, shown):
    assert redact(argv) == shown


def test_urls_in_values_and_free_text_lose_their_credentials():
    assert redact({"DATABASE_URL": "postgres://u:PASS@h/db", "note": "see https://u:PASS@h/x and ssh://git@h"}) == {
        "DATABASE_URL": f"postgres://u:{REDACTED}@h/db", "note": f"see https://u:{REDACTED}@h/x and ssh://git@h"}
    assert redact({"auth": "x", "author": "y"}) == {"auth": REDACTED, "author": "y"}
    assert redact_text('URL = "https://u:PASS@h/x"\n') == f'URL = "https://u:{REDACTED}@h/x"\n'


def test_script_arguments_are_redacted_and_the_rest_kept():
    assert redact(ARGV) == ["--api-key", REDACTED, "--token=" + REDACTED, "AWS_SECRET_KEY=" + REDACTED,
                            "HF_TOKEN=" + REDACTED, "--password", REDACTED, "--lr", "0.1", REDACTED, REDACTED,
                            "--keep", "3", "--epochs", "2",
                            "--auth", REDACTED, "--auth=" + REDACTED, "-k", REDACTED, "-p", REDACTED, "-P", REDACTED,
                            "-p" + REDACTED, "--db", f"postgres://u:{REDACTED}@db.example/prod",
                            f"--hub=https://user:{REDACTED}@hub.example/x", "--repo", f"https://{REDACTED}@git.example/r.git",
                            "-p", "/data/x", "-P", "8080", "-k", "./keys", "--mirror", "ssh://git@git.example/r.git"]
    assert redact(("python", "train.py", "--token", "x")) == ("python", "train.py", "--token", REDACTED)


def test_config_keys_and_key_shaped_values_are_redacted():
    record = redact({"wandb_api_key": "x", "aws_access_key": "y", "keep": 3, "extra": {"comment": WANDB_LIKE},
                     "monkey": "z", "empty_token": ""})
    assert record == {"wandb_api_key": REDACTED, "aws_access_key": REDACTED, "keep": 3,
                      "extra": {"comment": REDACTED}, "monkey": "z", "empty_token": ""}


def test_the_w_and_b_record_and_config_yaml_hold_no_secret(tmp_path):
    (tmp_path / "x.py").write_text("pass\n")
    cfg = load_config(None, [f"slurm.extra={{comment: {WANDB_LIKE}}}", "wandb.tags=[ok,hf_abcdefghijklmnopqrstuvwx]",
                             f"script.path={tmp_path / 'x.py'}", f"script.args={json.dumps(ARGV)}", *OVERRIDES[:1]])
    assert WANDB_LIKE in json.dumps(to_dict(cfg))  # the job itself gets the real values
    assert "k-fifteen" in json.dumps(to_dict(cfg)) and "k-twelve" in json.dumps(to_dict(cfg))
    for text in (json.dumps(config_record(cfg)), to_yaml(cfg)):
        assert WANDB_LIKE not in text and "hf_abcdefghijklmnopqrstuvwx" not in text and "ok" in text
        assert [s for s in SECRETS if s in text] == [], text


@pytest.mark.timeout(180)
def test_a_real_run_records_no_secret_gives_the_script_its_argv_and_follows_the_umask(tmp_path):
    script = tmp_path / "argv.py"
    # each rank checks it got the real values (a redacted one would fail it), rank 0 writes what it got
    # one optimizer step: its step record makes the launcher start its own W&B run (offline), whose files are checked too
    script.write_text("import json, os, sys, torch\n"
                      "assert sys.argv[1:] == json.loads(os.environ['ARGV_IN']), sys.argv\n"
                      "assert os.environ['TORCH_MIRROR_URL'] == json.loads(os.environ['ENV_IN'])['TORCH_MIRROR_URL']\n"
                      "p = torch.nn.Parameter(torch.zeros(1)); opt = torch.optim.SGD([p], lr=0.1)\n"
                      "p.sum().backward(); opt.step()\n"
                      "if os.environ['RANK'] == '0':\n"
                      "    open(os.environ['ARGV_OUT'], 'w').write(json.dumps(sys.argv[1:]))\n")
    out, got, argv = tmp_path / "runs", tmp_path / "argv.json", [*ARGV, *SHAPED, *KEPT]
    launch = [sys.executable, "-m", "launcher", "--gpus", "2", f"output_dir={out}", *OVERRIDES, *SHAPED_OVERRIDES,
              str(script), *argv]
    env = {"ARGV_OUT": str(got), "ARGV_IN": json.dumps(argv), "ENV_IN": json.dumps(ENV), **ENV}
    result = run_bounded(["sh", "-c", 'umask 027 && exec "$@"', "sh", *launch], cwd=REPO, timeout=150, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(got.read_text()) == argv  # the script still receives its real arguments
    assert [s for s in SECRETS if s in result.stdout + result.stderr] == [], "the launcher printed a secret"
    run_dir = only_run_dir(out)
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    # the records a secret must not reach, all of which this run writes (logs: the launcher's and the ranks')
    written = {str(p.relative_to(run_dir)) for p in files}
    assert {"config.yaml", "plan.json", "summary.json", "logs/launcher.log", "logs/rank-0.log"} <= written, written
    [vm] = [p for p in files if p.parent.name == "env" and p.suffix == ".json"]
    assert [p for p in files if p.suffix == ".wandb"], f"the launcher's W&B run (its args metadata) is missing: {written}"
    for path in files:
        text = path.read_text(errors="replace")
        assert not [s for s in SECRETS if s in text], f"{path} holds a secret"
    command = json.loads((run_dir / "plan.json").read_text())["command"]
    assert command[2:4] == ["--api-key", REDACTED] and command[-len(KEPT) - len(SHAPED) - 8:-len(KEPT) - len(SHAPED)] \
        == ARGV[-8:] and command[-len(KEPT):] == KEPT  # look-alikes kept
    assert f"postgres://u:{REDACTED}@db.example/prod" in command
    recorded = json.loads(vm.read_text())["command"]  # the command line: the list override's key redacted, look-alikes kept
    assert f"wandb.tags=[ok,{REDACTED}]" in recorded and recorded[-len(KEPT):] == KEPT, recorded
    for name in ("plan.json", "config.yaml", "summary.json"):
        mode = stat.S_IMODE((run_dir / name).stat().st_mode)
        assert mode == 0o640, f"{name} is {oct(mode)} under umask 027"


@pytest.mark.timeout(120)
def test_the_dry_run_print_holds_no_secret(tmp_path):
    script = tmp_path / "argv.py"
    script.write_text("pass\n")
    result = run_bounded([sys.executable, "-m", "launcher", "--dry-run", "--gpus", "2", f"output_dir={tmp_path / 'runs'}",
                          *OVERRIDES, *SHAPED_OVERRIDES, str(script), *ARGV, *SHAPED, *KEPT], cwd=REPO, timeout=100,
                         env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "# launch plan" in result.stdout and f"postgres://u:{REDACTED}@db.example/prod" in result.stdout
    assert [s for s in SECRETS if s in result.stdout + result.stderr] == [], result.stdout
    assert all(kept in result.stdout for kept in KEPT), result.stdout
