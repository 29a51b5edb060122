"""Every command line of torchrun's documentation (torch.distributed.run's docs page) and of the pytorch/examples
distributed folder runs under `python -m launcher` as under torchrun: the same script (tests/scripts/observer.py,
2 workers) sees the same environment, its run id included.

The lines torchrun itself runs alike are one run here: torch.distributed.run.run gives `--nproc_per_node 2`,
`--nnodes 1 --nproc_per_node 2` and `--standalone --nnodes=1 --nproc-per-node=2` the same c10d rendezvous on a free
localhost port (the mapping test below holds the launcher to one line for all three, and
tests/test_torchrun_fidelity.py's plain observer runs the standalone one). The module line (`-m`) and a c10d line with
--rdzv-id run in tests/test_torchrun_flags.py; the fault-tolerant line is that c10d line with --max-restarts=3.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from launcher.config.elastic import min_nodes
from launcher.config.schema import load_config, to_dict
from launcher.config.torchrun_flags import launcher_argv
from launcher.usage import config_overrides, parse_args, value_flags
from tests.helpers import finish_all, free_port, launcher_env
from tests.test_torchrun_fidelity import (
    COMMON_ENV,
    RUN_TIMEOUT_S,
    SCRIPTS,
    env_differences,
)
from tests.test_torchrun_flags import HOST, both

pytestmark = pytest.mark.timeout(300)

# torchrun's own docs page (torch/distributed/run.py): "Single-node multi-worker", "Stacked single-node multi-worker",
# "Fault tolerant" and "Elastic", with $NUM_TRAINERS=2 and one node; and the pytorch/examples distributed folder's
# lines (FSDP2 and tensor_parallelism READMEs, ddp/run_example.sh, minGPT-ddp/run_example.sh, the DDP tutorial series).
ALIKE = ["--standalone --nnodes=1 --nproc-per-node=2", "--nproc_per_node 2", "--nnodes 1 --nproc_per_node 2",
         "--nnodes=1 --nproc_per_node=2", "--nnodes 1 --nproc-per-node 2", "--standalone --nproc_per_node=2"]


def mapped(line: str) -> list[str]:
    return launcher_argv([*line.split(), "t.py"], value_flags(), HOST)


def resolved(line: str) -> str:
    """The config a torchrun line resolves to (launcher.cli's path: mapped, parsed, turned into overrides)."""
    args, script = parse_args(mapped(line))
    cfg = load_config(overrides=config_overrides(args))
    cfg.min_nodes = min_nodes(cfg)  # None is nodes: `--nnodes 1` gives 1
    return json.dumps(to_dict(cfg), sort_keys=True) + repr(script)


def test_the_lines_torchrun_runs_alike_resolve_to_one_config():
    assert len({resolved(line) for line in ALIKE}) == 1
    assert resolved(ALIKE[0]) == resolved("--gpus 2 rdzv.torchelastic_run_id=FRESH")


@pytest.mark.parametrize("line, run_id", [
    ("--standalone --nnodes=1 --nproc-per-node=2", "FRESH"),  # torchrun: a fresh uuid4 where it picks the port
    ("--nproc_per_node 2 --rdzv-id x", "FRESH"),  # one node, no rendezvous flag: --rdzv-id is replaced, as there
    ("--rdzv-backend=c10d --rdzv-endpoint=localhost:0 --nnodes=1 --nproc-per-node=2", "none"),
    ("--nnodes 1 --master-port 29600 --nproc-per-node 2", "none"),
    ("--nnodes=1 --nproc_per_node=2 --rdzv_id=101 --rdzv_endpoint=localhost:5972", "101"),  # YAML's int: kept text
    ("--nnodes=2 --nproc-per-node=2 --rdzv-id=job7 --rdzv-backend=c10d --rdzv-endpoint=h0:29400", "job7"),
])
def test_each_line_asks_for_torchruns_run_id(line, run_id):
    from tests.test_torchrun_flags import run_id_of

    assert run_id_of(f"{line} t.py") == run_id


@pytest.mark.parametrize("line, expected", [
    # port 0: the one node's agent picks a free port, as the launcher's single-node default does
    ("--rdzv-backend=c10d --rdzv-endpoint=localhost:0 --nnodes=1 --nproc-per-node=2", ["--nodes", "1", "--gpus", "2"]),
    # no port: torch's c10d default, 29400 ("If no port number is specified HOST_NODE_ADDR defaults to 29400")
    ("--nnodes=2 --nproc-per-node=2 --max-restarts=3 --rdzv-id=j --rdzv-backend=c10d --rdzv-endpoint=node1",
     ["--nodes", "2", "--gpus", "2", "--max-restarts", "3", "--rdzv-endpoint", "node1:29400", "--rdzv-id", "j"]),
    ("--nnodes=1:4 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=[::1]",
     ["--nodes", "1:4", "--gpus", "2", "--rdzv-endpoint", "[::1]:29400"]),
    ("--nproc-per-node +2", ["--gpus", "2"]),  # int() reads it, as torchrun does
])
def test_the_documented_rendezvous_endpoints_mean_what_they_mean_to_torchrun(line, expected):
    assert [t for t in mapped(line) if not t.startswith("rdzv.torchelastic")] == [*expected, "--", "t.py"]


def env_pairs(outs: tuple[Path, Path], ranks: int = 2) -> list[tuple[dict[str, str], dict[str, str]]]:
    pairs = []
    for rank in range(ranks):
        ours, theirs = (json.loads((out / f"seen-{rank}.json").read_text())["env"] for out in outs)
        pairs.append((ours, theirs))
    return pairs


@pytest.mark.slow
def test_the_stacked_single_node_line_runs_alike_on_a_port_the_node_picks(tmp_path):
    """torchrun's docs: "For --nodes=1, its often convenient to let torchrun pick a free random port"."""
    seen, _ = both(tmp_path, ["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--nnodes=1",
                              "--nproc-per-node=2"], ["observer.py"])
    for ours, theirs in seen:
        assert ours["TORCHELASTIC_RUN_ID"] == theirs["TORCHELASTIC_RUN_ID"] == "none"
        assert int(ours["MASTER_PORT"]) > 0 and int(theirs["MASTER_PORT"]) > 0
        assert env_differences(ours, theirs, watchdog=False) == {}


@pytest.mark.slow
def test_the_elastic_line_runs_alike_and_its_start_line_says_what_runs(tmp_path):
    """torchrun's "Elastic (min=1, max=4)" line on one node; last_call_timeout=1 (a --rdzv-conf option of the same
    page) under both, where torch would wait 30 s for nodes that never come."""
    flags = ["--nnodes=1:4", "--nproc-per-node=2", "--max-restarts=3", "--rdzv-id=elastic", "--rdzv-backend=c10d",
             f"--rdzv-endpoint=localhost:{free_port()}", "--rdzv-conf=last_call_timeout=1"]
    seen, run = both(tmp_path, flags, ["observer.py"])
    for ours, theirs in seen:
        assert ours["TORCHELASTIC_RUN_ID"] == theirs["TORCHELASTIC_RUN_ID"] == "elastic"
        assert ours["TORCHELASTIC_MAX_RESTARTS"] == theirs["TORCHELASTIC_MAX_RESTARTS"] == "3"
        assert ours["WORLD_SIZE"] == theirs["WORLD_SIZE"] == "2"
        assert env_differences(ours, theirs, watchdog=False) == {}
    said = run.stderr
    assert "running 2 CPU workers (1 node x 2; elastic 1:4 nodes)" in said, said
    assert "8 workers" not in said and "4 nodes x 2" not in said, said


@pytest.mark.slow
def test_the_pytorch_examples_run_example_line_runs_alike(tmp_path):
    """ddp/run_example.sh and tensor_parallelism/run_example.sh: torchrun's default (static) rendezvous at an endpoint,
    with an id; its fixed port 5972 replaced by a free one."""
    port = str(free_port())
    seen, _ = both(tmp_path, ["--nnodes=1", "--nproc_per_node=2", "--rdzv_id=101", f"--rdzv_endpoint=localhost:{port}"],
                   ["observer.py"])
    for ours, theirs in seen:
        assert ours["TORCHELASTIC_RUN_ID"] == theirs["TORCHELASTIC_RUN_ID"] == "101"
        assert ours["MASTER_PORT"] == theirs["MASTER_PORT"] == port
        assert ours["MASTER_ADDR"] == theirs["MASTER_ADDR"] == "localhost"  # the endpoint's host, under both
        assert env_differences({**ours, "MASTER_ADDR": "127.0.0.1"}, theirs, watchdog=False) == {}


def run_nodes(argv: Sequence[Sequence[str]], cwd: Path) -> list[str]:
    """Each argv a node, all started at once, to completion (each in its own session, killed on timeout)."""
    procs = [subprocess.Popen(list(a), cwd=cwd, env=launcher_env(COMMON_ENV), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True) for a in argv]
    outputs = finish_all(procs, timeout=RUN_TIMEOUT_S)
    assert [p.returncode for p in procs] == [0] * len(procs), "\n---\n".join(outputs)
    return outputs


@pytest.mark.slow
def test_the_ddp_tutorials_multinode_line_runs_alike_on_two_nodes(tmp_path):
    """The DDP tutorial series' multinode line (and its SLURM script's, without srun): two nodes of one worker each
    meet at a c10d endpoint; --node_rank is ignored with c10d, under both (the launcher says so in a note)."""
    shutil.copy(SCRIPTS / "observer.py", tmp_path / "observer.py")
    outs = (tmp_path / "ours", tmp_path / "theirs")
    for out in outs:
        out.mkdir()
    lines = {}
    for who, out in zip(("ours", "theirs"), outs):
        port = free_port()
        flags = [["--nproc_per_node=1", "--nnodes=2", f"--node_rank={k}", "--rdzv_id=456", "--rdzv_backend=c10d",
                  f"--rdzv_endpoint=127.0.0.1:{port}"] for k in (0, 1)]
        head = ([sys.executable, "-m", "launcher", f"output_dir={tmp_path / 'runs'}", "wandb.mode=disabled",
                 "watchdog.timeout_s=0"] if who == "ours" else [sys.executable, "-m", "torch.distributed.run"])
        lines[who] = run_nodes([[*head, *f, "observer.py", "--out", str(out)] for f in flags], tmp_path)
    assert any("note: --node-rank ignored" in text for text in lines["ours"]), lines["ours"]
    for ours, theirs in env_pairs(outs):
        assert ours["TORCHELASTIC_RUN_ID"] == theirs["TORCHELASTIC_RUN_ID"] == "456"
        assert ours["WORLD_SIZE"] == theirs["WORLD_SIZE"] == "2" and ours["LOCAL_WORLD_SIZE"] == "1"
        assert env_differences(ours, theirs, watchdog=False) == {}
