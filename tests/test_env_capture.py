"""Each run records what produced it (env/<host>.json, env/git.diff, env/packages.txt), secrets redacted.

A real script run from a git repository with an uncommitted change: the record names the commit,
says the tree is dirty and keeps the diff, hashes the script, names torch's version; secret-looking
environment variables and a token in the diff reach no file of the run directory.
"""

import hashlib
import importlib.metadata
import json
import socket
import subprocess

import pytest

from launcher.config.secrets import redact_text
from launcher.provenance.capture import distributed_env
from tests.helpers import run_launcher

SECRETS = {"NCCL_IB_HCA": "hf_abcdefghijklmnopqrstuvwxyz0123", "TORCH_HUB_TOKEN": "plain-but-named-secret-4711",
           "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567"}
DIFF_SECRET = "diff-secret-value-8815"


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_records_commit_dirty_diff_script_hash_torch_and_redacts_secrets(tmp_path):
    repo = tmp_path / "code"
    repo.mkdir()
    script = repo / "train.py"
    script.write_text("print('training')\n")
    git(repo, "init", "-q")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", "train.py")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    script.write_text(f"API_TOKEN = '{DIFF_SECRET}'\nprint('training, changed')\n")  # uncommitted
    runs = tmp_path / "runs"
    done = run_launcher(["--gpus", "1", f"output_dir={runs}", "run_id=env", str(script)], cwd=tmp_path, timeout=180,
                        env={**SECRETS, "NCCL_DEBUG": "INFO"})
    assert done.returncode == 0, done.stderr
    run_dir = runs / "env"
    record = json.loads((run_dir / "env" / f"{socket.gethostname()}.json").read_text())
    assert record["git"]["commit"] == git(repo, "rev-parse", "HEAD") and record["git"]["dirty"] is True
    diff = (run_dir / record["git"]["diff_file"]).read_text()
    assert "print('training, changed')" in diff and "API_TOKEN = '<redacted>'" in diff
    assert record["script"]["sha256"] == hashlib.sha256(script.read_bytes()).hexdigest()
    assert record["torch"]["version"] == importlib.metadata.version("torch")
    assert "run_id=env" in record["command"] and record["host"] == socket.gethostname()
    assert record["env"]["NCCL_DEBUG"] == "INFO"
    assert {record["env"][k] for k in ("NCCL_IB_HCA", "TORCH_HUB_TOKEN")} == {"<redacted>"}
    assert f"torch=={importlib.metadata.version('torch')}" in (run_dir / "env" / "packages.txt").read_text()
    for path in run_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            leaked = [v for v in [*SECRETS.values(), DIFF_SECRET] if v.encode() in data]
            assert not leaked, f"{path} holds {leaked}"


def test_only_distributed_variables_are_kept_and_secrets_redacted():
    kept = distributed_env({"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "2", "HOME": "/root", "CUDA_VISIBLE_DEVICES": "0,1",
                            "MASTER_ADDR": "node1", "NCCL_TOKEN": "x", "GLOO_SOCKET_IFNAME": "ghp_" + "a" * 30})
    assert kept == {"CUDA_VISIBLE_DEVICES": "0,1", "GLOO_SOCKET_IFNAME": "<redacted>", "MASTER_ADDR": "node1",
                    "NCCL_DEBUG": "INFO", "NCCL_TOKEN": "<redacted>", "OMP_NUM_THREADS": "2"}


def test_a_diff_keeps_commit_ids_and_loses_tokens():
    text = ("+API_KEY = 'abc'\n+password: hunter2\n+monkey = 4\n+x = 'hf_" + "b" * 24 + "'\n"
            "index cf30153c4c131c8164ee7798e5022d810682e2cb\n")
    assert redact_text(text) == ("+API_KEY = '<redacted>'\n+password: <redacted>\n+monkey = 4\n+x = '<redacted>'\n"
                                 "index cf30153c4c131c8164ee7798e5022d810682e2cb\n")
