"""`--cluster ray`: check the cluster can place the job, make its run directory, then drive it (launcher.backends.ray.job).

With --wait the job runs from this process; without, from a detached driver whose pid job.json records
(`status`, `logs`, `cancel` find it there). Nothing is created before Ray is importable, the cluster
answers at its address and the placement fits: each of those fails in one line, exit 2.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Tuple

from launcher.backends.base import KIND_FIELD
from launcher.backends.children import launcher_module_command
from launcher.backends.ray import cluster, code
from launcher.backends.ray.options import ray_section
from launcher.backends.ray.records import JOB_FILE, outcome_line, update_job
from launcher.config.schema import Config, to_dict, to_yaml
from launcher.logs import setup_launcher_logging
from launcher.plan import new_run_id
from launcher.rundir import create_run_dir, read_json, write_atomic, write_json
from launcher.runlock import existing_run
from launcher.runtime import safefs


def prepare(cfg: Config) -> Tuple[str, Path]:
    """cfg made ready to place (absolute paths, a run id): the cluster's address and the run directory."""
    cluster.import_ray()  # one line, before anything else, where Ray is not installed
    address = cluster.cluster_address(cfg)
    cfg.output_dir = str(Path(cfg.output_dir).resolve())  # the nodes may start in other directories
    cfg.run_id = cfg.run_id or new_run_id()
    cfg.script.path = code.script_path(cfg, code.working_folder())  # inside the shipped folder: relative to it
    return address, Path(cfg.output_dir) / cfg.run_id


def submit(cfg: Config, dry_run: bool = False, wait: bool = False) -> int:
    """Place cfg on the Ray cluster at ray.address; print how to follow it; with wait, drive it to the end."""
    address, run_dir = prepare(cfg)
    if dry_run:
        print(dry_run_text(cfg, address, run_dir), end="")
        return 0
    if (run_dir / "config.yaml").is_file():
        raise existing_run(run_dir, run_dir.name)  # prepare() gave cfg its run_id: run_dir's name
    if ray_section(cfg).ship_code:
        code.check_size(cfg, code.working_folder())  # before the cluster is asked for anything
    check_placement(cfg, address)
    create_run_dir(cfg.output_dir, run_dir.name, cfg.launcher.allow_other_owner)
    write_atomic(run_dir / "config.yaml", to_yaml(cfg, recorded=True))
    write_json(run_dir / JOB_FILE, {
        "cluster": "ray", KIND_FIELD: "ray", "run_id": cfg.run_id, "address": address, "state": "PENDING", "run_dir": str(run_dir),
        "nodes": cfg.nodes, "gpus_per_node": cfg.gpus, "submitted_at": datetime.datetime.now().astimezone().isoformat()})
    if wait:
        return drive_here(cfg, run_dir)
    pid = start_driver(cfg, run_dir)
    update_job(run_dir, {"driver_pid": pid})
    quoted = shlex.quote(str(run_dir))
    print(f"submitted Ray job {cfg.run_id} to {address}: {cfg.nodes} node(s) x {cfg.gpus} worker(s); driver pid {pid}; "
          f"run directory {run_dir}\n  follow: python -m launcher status {quoted}   |   python -m launcher logs {quoted} "
          f"[--rank K]   |   python -m launcher cancel {quoted}", flush=True)
    return 0


def check_placement(cfg: Config, address: str) -> None:
    """Connect and place the job's bundles once, then give them back: a job that cannot run is refused here."""
    ray = cluster.connect(address)
    try:
        bundles = [cluster.bundle(cfg, cluster.gpus_to_request(cfg, ray))] * cfg.nodes
        cluster.remove(ray, cluster.place(ray, cfg, f"launcher-{cfg.run_id}-check", bundles))
    finally:
        ray.shutdown()


def drive_here(cfg: Config, run_dir: Path) -> int:
    from launcher.backends.ray.job import RayJob, job_secret

    from launcher.backends.slurm.records import following, rank_log

    setup_launcher_logging(None)
    update_job(run_dir, {"driver_pid": os.getpid()})
    # --wait shows rank 0's log as it grows, and node 0's own lines (it starting, meeting the others), as SLURM's does
    with following(rank_log(run_dir, 0), run_dir / "logs" / "ray-node-0.log"):
        code = RayJob(cfg, run_dir, job_secret(cfg)).run()
    job = read_json(run_dir / JOB_FILE)
    print(f"[launcher] {outcome_line(run_dir, job, job.get('state', '?'))}", file=sys.stderr, flush=True)
    print(f"[launcher] run directory {run_dir}", file=sys.stderr, flush=True)
    return code


def start_driver(cfg: Config, run_dir: Path) -> int:
    """The detached driver: its own session (a Ctrl-C here does not reach it), the config on its stdin."""
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)
    with safefs.open_file(str(logs / "ray-driver.out"), "ab", root=str(run_dir)) as out:  # no link, no FIFO followed
        proc = subprocess.Popen(launcher_module_command("launcher.backends.ray.job", str(run_dir)), stdin=subprocess.PIPE,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(to_dict(cfg)).encode())
    proc.stdin.close()
    return proc.pid


def dry_run_text(cfg: Config, address: str, run_dir: Path) -> str:
    """The placement group and each node's command, as the job would make them (nothing contacted)."""
    bundle: Dict[str, Any] = cluster.bundle(cfg, 0 if ray_section(cfg).gpus == "never" else cfg.gpus)
    gpu_note = "" if ray_section(cfg).gpus != "auto" else " (GPU only where the cluster has GPUs: ray.gpus=auto)"
    lines = [f"# Ray cluster {address}: placement group launcher-{cfg.run_id}-0, STRICT_SPREAD, "
             f"{cfg.nodes} bundle(s) of {bundle}{gpu_note}",
             "# one NodeRunner actor per bundle runs, on its node (payload on stdin, rendezvous secret in its environment):"]
    for k in range(cfg.nodes):
        lines.append(f"#   node {k} (ranks {k * cfg.gpus}-{(k + 1) * cfg.gpus - 1}): {sys.executable} -m launcher.backends.ray.task "
                     f"<actor pid>  = python -m launcher --nodes {cfg.nodes} --gpus {cfg.gpus} --node-rank {k} "
                     f"--master-addr <node 0's IP> --master-port <free port on node 0> ...")
    lines.append(code.describe(cfg, code.working_folder()))
    lines.append(f"# run directory (a path every node shares): {run_dir}")
    return "\n".join(lines) + "\n# resolved config\n" + to_yaml(cfg)
