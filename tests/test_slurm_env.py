"""SLURM without a cluster: node-list parsing, the environment mapping, submission parameters, the dry-run text.

Pure mapping logic only (mock.patch.dict for SLURM's variables); what SLURM does is tested
against the real dev cluster in test_slurm.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from launcher.backends.slurm.environment import SlurmEnvironment, parse_nodelist, port_for_job
from launcher.config.schema import load_config
from launcher.errors import ConfigError, LaunchError
from launcher.backends.registry import adopt_allocation
from launcher.backends.slurm.environment import should_submit
from launcher.backends.slurm.submit import executor_parameters
from tests.helpers import REPO, run_launcher

GOLDEN = Path(__file__).parent / "golden" / "slurm_dry_run.txt"


@pytest.mark.parametrize("text, hosts", [
    ("node1", ["node1"]),
    ("node1,node2", ["node1", "node2"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("gpu[01-03,7],cpu5", ["gpu01", "gpu02", "gpu03", "gpu7", "cpu5"]),
    ("a[8-10]-ib", ["a8-ib", "a9-ib", "a10-ib"]),
    ("tux[1-3,5]", ["tux1", "tux2", "tux3", "tux5"]),
    ("x[09-11]", ["x09", "x10", "x11"]),
    ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
    ("n[1-2]c[3,5],login", ["n1c3", "n1c5", "n2c3", "n2c5", "login"]),
    ("rack1-node[1-2],rack2-node[5]", ["rack1-node1", "rack1-node2", "rack2-node5"]),
])
def test_nodelist_forms(text, hosts):
    assert parse_nodelist(text) == hosts


def test_a_malformed_nodelist_is_named():
    with pytest.raises(LaunchError, match="SLURM_JOB_NODELIST='node\\[1-2'"):
        parse_nodelist("node[1-2")


# SLURM's documented hostlist forms, held against SLURM's own expansion. scontrol needs only a
# config file to expand a host list (no controller), so a throwaway one serves.
SCONTROL_FORMS = ("node[1-2]", "node1,node2", "gpu[01-03,7],cpu5", "tux[1-3,5]", "x[09-11]",
                  "rack[1-2]-node[01-02]", "node[1-2]-ib[1-2]", "n[1-2]c[3,5],login", "a[1-2],b[3-4]")


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="SLURM's scontrol is not installed")
@pytest.mark.timeout(60)
def test_nodelist_agrees_with_scontrol(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=parse\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1 State=UNKNOWN\n"
                    "PartitionName=p Nodes=n1 Default=YES\n")
    for text in SCONTROL_FORMS:
        done = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True, text=True, timeout=20,
                              env={**os.environ, "SLURM_CONF": str(conf)})
        assert done.returncode == 0, (text, done.stderr)
        assert parse_nodelist(text) == done.stdout.split(), text


def test_port_is_the_same_for_a_job_and_differs_between_jobs():
    assert port_for_job("1234") == port_for_job("1234")
    assert len({port_for_job(str(j)) for j in range(50)}) > 40
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(20000 <= port_for_job(str(j)) < min(32768, ephemeral_low) for j in range(500))  # never a port the kernel lends out


STEP = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_NODEID": "1", "SLURM_PROCID": "1",
        "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "node[1-2]"}


def test_a_job_step_maps_to_the_static_rendezvous():
    with mock.patch.dict(os.environ, STEP, clear=True):
        assert SlurmEnvironment.detect() and not should_submit(load_config(None, ["cluster=slurm"]))
        cfg = adopt_allocation(load_config(None, ["gpus=2"]))
    assert (cfg.nodes, cfg.rdzv.node_rank, cfg.rdzv.master_addr) == (2, 1, "node1")
    assert cfg.rdzv.master_port == port_for_job("77") and cfg.run_id == "slurm-77"
    assert cfg.launcher.omp_threads == 0  # SLURM did not say how many CPUs: cores / workers, as locally
    with mock.patch.dict(os.environ, {**STEP, "SLURM_CPUS_PER_TASK": "8"}, clear=True):
        assert adopt_allocation(load_config(None, ["gpus=2"])).launcher.omp_threads == 4


def test_batch_shell_is_not_a_step_and_plain_runs_ignore_slurm():
    batch = {k: v for k, v in STEP.items() if k != "SLURM_STEP_ID"}
    with mock.patch.dict(os.environ, batch, clear=True):
        assert not SlurmEnvironment.detect()
        assert should_submit(load_config(None, ["cluster=slurm"]))
        assert adopt_allocation(load_config(None, [])).rdzv.node_rank is None


def test_one_task_per_node_is_required_with_the_fix_named():
    with mock.patch.dict(os.environ, {**STEP, "SLURM_NTASKS": "4"}, clear=True):
        with pytest.raises(ConfigError, match="--ntasks-per-node=1"):
            adopt_allocation(load_config(None, []))
    with mock.patch.dict(os.environ, STEP, clear=True):
        with pytest.raises(ConfigError, match="--nodes 3 but this SLURM job has 2"):
            adopt_allocation(load_config(None, ["nodes=3"]))


def test_executor_parameters_one_task_per_node_and_gpus_from_the_flag():
    cfg = load_config(None, ["nodes=4", "gpus=8", "launcher.omp_threads=4", "slurm.partition=gpu",
                             "slurm.account=proj", "slurm.mem=64G", "slurm.extra={exclusive: true}"])
    params = executor_parameters(cfg, gpus_per_node=8)
    assert params["nodes"] == 4 and params["ntasks_per_node"] == 1 and params["gpus_per_node"] == 8
    assert params["cpus_per_task"] == 32 and params["partition"] == "gpu" and params["account"] == "proj"
    assert params["additional_parameters"] == {"exclusive": True} and params["mem"] == "64G"
    assert "gpus_per_node" not in executor_parameters(cfg, gpus_per_node=0)  # a CPU cluster


def test_dry_run_prints_the_sbatch_script_golden(tmp_path):
    args = ["--cluster", "slurm", "--nodes", "2", "--gpus", "2", "--dry-run", "--output-dir", str(tmp_path),
            "run_id=golden", "slurm.partition=debug", "slurm.gpus=never", "slurm.time_min=30", "slurm.qos=normal"]
    result = run_launcher(args, cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    text = result.stdout.split("# resolved config")[0]
    text = text.replace(str(tmp_path), "<OUTPUT_DIR>").replace(sys.executable, "<PYTHON>")
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text.splitlines() == GOLDEN.read_text().splitlines(), "set UPDATE_GOLDEN=1 to accept a change"
    assert not (tmp_path / "golden").exists(), "a dry run creates nothing"


def test_bad_slurm_values_are_one_line_errors(tmp_path):
    result = run_launcher(["--cluster", "slurm", "slurm.gpus=maybe", "--dry-run"], cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and "slurm.gpus" in result.stderr and "Traceback" not in result.stderr
    result = run_launcher(["status", "12345", "--output-dir", str(tmp_path)], cwd=REPO, timeout=60)
    assert result.returncode == 2 and "no run '12345'" in result.stderr


def test_wait_without_slurm_is_refused(tmp_path):
    result = run_launcher(["--wait", "--dry-run"], cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and "--wait follows a submitted job: add --cluster slurm" in result.stderr


@pytest.mark.timeout(60)
def test_the_task_process_loads_no_torch(tmp_path):
    """submitit's process in each task unpickles the callable and calls it; the node agent it starts imports torch
    once for itself and the workers' zygote (launcher.backends.slurm.task). Loading the callable must not pull
    torch into submitit's process: that was a second `import torch` (~2 CPU-s) on every node."""
    import pickle

    from launcher.backends.slurm.task import SlurmNodeAgent, TaskSpec
    from launcher.config.schema import load_config

    cfg = load_config(None, [f"output_dir={tmp_path}", "run_id=r"])
    pickled = tmp_path / "submitted.pkl"
    pickled.write_bytes(pickle.dumps(SlurmNodeAgent(TaskSpec.of(cfg))))
    probe = ("import pickle, sys; agent = pickle.load(open(sys.argv[1], 'rb')); "
             "print(type(agent).__name__, agent.task.run_id, agent.task.workers, "
             "any(m in sys.modules for m in ('torch', 'omegaconf')))")
    done = subprocess.run([sys.executable, "-c", probe, str(pickled)], capture_output=True, text=True, timeout=50,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["SlurmNodeAgent", "r", "trainer", "False"]
