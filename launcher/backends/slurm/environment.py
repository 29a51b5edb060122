"""SLURM's environment as the launcher's rendezvous: which node this is, where node 0 is, which port.

The SLURM engine's launcher.backends.allocation.ClusterEnvironment. Read-only: getters never write
os.environ. One SLURM task per node runs the node agent (see docs/slurm.md, Design), so SLURM_NODEID
is the node rank and SLURM_JOB_NODELIST's first host runs node 0. Every node derives the same port
from the job id alone, so nothing has to be sent.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

from launcher.backends.allocation import ClusterEnvironment
from launcher.config.sections import Config
from launcher.errors import ConfigError, LaunchError
from launcher.backends.slurm.submitit_private import expand_nodelist

# Our name -> SLURM's variable (a data table, like submitit's SlurmJobEnvironment._env).
ENV: Dict[str, str] = {
    "job_id": "SLURM_JOB_ID",
    "array_job_id": "SLURM_ARRAY_JOB_ID",
    "array_task_id": "SLURM_ARRAY_TASK_ID",
    "step_id": "SLURM_STEP_ID",
    "node_rank": "SLURM_NODEID",
    "global_rank": "SLURM_PROCID",
    "num_nodes": "SLURM_JOB_NUM_NODES",
    "ntasks": "SLURM_NTASKS",
    "ntasks_per_node": "SLURM_NTASKS_PER_NODE",
    "nodelist": "SLURM_JOB_NODELIST",
    "restart_count": "SLURM_RESTART_COUNT",
    "cpus_per_task": "SLURM_CPUS_PER_TASK",
}
# Above the well-known ports and below Linux's default ephemeral range (32768-60999): a port in that range
# can be held at any moment by some process's outgoing connection (CI saw job 159's port 49470 taken
# that way, and node 0 refused to start). Every node derives the same port, so this is a constant, not
# each machine's own ip_local_port_range.
PORT_RANGE = (20000, 32767)


def parse_nodelist(text: str) -> List[str]:
    """'rack[1-2]-node[01-02],gpu7' -> rack1-node01, rack1-node02, rack2-node01, rack2-node02, gpu7.

    SLURM's hostlist forms (what `scontrol show hostnames` expands, zero padding kept, any number of
    bracket groups per name), through submitit's own expansion: the parser its SLURM tasks use for
    the same variable, so one well-kept implementation serves both (reached through submitit_private).
    """
    try:
        return expand_nodelist(text.strip())
    except ValueError as e:
        raise LaunchError(f"SLURM_JOB_NODELIST={text!r} is not a node list SLURM writes: "
                          "check the job's environment (`scontrol show hostnames $SLURM_JOB_NODELIST`)") from e


def port_for_job(job_id: str) -> int:
    """The same port on every node of a job, different (most likely) for the next job."""
    return random.Random(job_id).randint(*PORT_RANGE)


@dataclass(frozen=True)
class SlurmEnvironment(ClusterEnvironment):
    """The SLURM allocation this process runs in, as a node agent needs it."""

    step_signals = (signal.SIGUSR2,)  # its warning before a time limit or a preemption (the trainer's node handles it)

    job_id: str
    node_rank: int
    num_nodes: int
    hosts: List[str]
    ntasks: int
    restart_count: int
    cpus_per_task: int  # 0 = not set (the task may use what the node gives it)

    @staticmethod
    def detect(env: Mapping[str, str] = os.environ) -> bool:
        """True inside a job step (srun, or a submitit task), where SLURM started one process per task.

        A batch script's shell or an salloc shell has SLURM_JOB_ID but no step: a launcher started
        there is a plain local run (or, with --cluster slurm, would need srun: see from_environ).
        """
        return bool(env.get(ENV["job_id"])) and bool(env.get(ENV["step_id"])) and bool(env.get(ENV["nodelist"]))

    @classmethod
    def from_environ(cls, env: Mapping[str, str] = os.environ) -> "SlurmEnvironment":
        def get(name: str, default: str = "") -> str:
            return env.get(ENV[name], default)

        # An array task's own id is ARRAYJOB_TASK; its SLURM_JOB_ID differs per task, which is what we want.
        hosts = parse_nodelist(get("nodelist"))
        return cls(
            job_id=get("job_id"),
            node_rank=int(get("node_rank", "0")),
            num_nodes=int(get("num_nodes", str(len(hosts)) or "1")),
            hosts=hosts,
            ntasks=int(get("ntasks", "1")),
            restart_count=int(get("restart_count", "0") or 0),
            cpus_per_task=int(get("cpus_per_task", "0") or 0),
        )

    @property
    def master_addr(self) -> str:
        return self.hosts[0]

    @property
    def master_port(self) -> int:
        return port_for_job(self.job_id)

    @property
    def run_id(self) -> str:
        """A run id every node of the job agrees on without talking (used when none was given)."""
        return f"slurm-{self.job_id}"

    def adopt(self, cfg: Config) -> Config:
        """Inside a SLURM job step, the allocation decides the nodes, this node's rank and node 0's address."""
        if self.ntasks != self.num_nodes:
            raise ConfigError(
                f"SLURM started {self.ntasks} tasks on {self.num_nodes} node(s), but the launcher runs one task per node "
                f"(its agent starts the --gpus workers): use `srun --ntasks-per-node=1 python -m launcher ...`")
        if cfg.nodes not in (1, self.num_nodes):
            raise ConfigError(f"--nodes {cfg.nodes} but this SLURM job has {self.num_nodes} node(s): "
                              f"drop --nodes inside an allocation, or allocate {cfg.nodes} nodes")
        cfg.nodes = self.num_nodes
        if self.cpus_per_task and not cfg.launcher.omp_threads:
            # The task owns SLURM_CPUS_PER_TASK CPUs, whatever the affinity mask says (without
            # task/affinity or cgroups it shows the whole machine): split those among the workers.
            cfg.launcher.omp_threads = max(1, self.cpus_per_task // cfg.gpus)
        cfg.run_id = cfg.run_id or self.run_id
        if self.num_nodes > 1:
            cfg.rdzv.node_rank = self.node_rank
            cfg.rdzv.master_addr = self.master_addr
            cfg.rdzv.master_port = self.master_port
        return cfg


def hostnames_via_scontrol(nodelist: str) -> Optional[List[str]]:
    """`scontrol show hostnames` where it is installed (it knows every form); None if it is not."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.split()


def should_submit(cfg: Config) -> bool:
    """--cluster slurm submits a job, except from inside one (then this process is a node of it)."""
    return cfg.cluster == "slurm" and not SlurmEnvironment.detect()
