"""What runs on each Ray node: `python -m launcher.backends.ray.task ACTOR_PID`, the payload on stdin.

The same launch as a SLURM task (launcher.backends.slurm.task): this node's agent joins a static
rendezvous on bundle 0's node, in the run directory the driver made (a path every node shares).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any, Dict, List

from launcher.agent.zygote import die_with_parent
from launcher.backends.dispatch import launch
from launcher.clock import process_start_time
from launcher.config.schema import Config, from_dict
from launcher.errors import LauncherError
from launcher.logs import setup_launcher_logging
from launcher.rundir import archive_rank_logs

log = logging.getLogger("launcher")


def node_config(payload: Dict[str, Any]) -> Config:
    """The job's config as node `node_rank` of a static rendezvous runs it."""
    cfg = from_dict(payload["config"])
    cfg.cluster = "local"  # this process is a node of the job, not a submission
    cfg.rdzv.node_rank = int(payload["node_rank"])
    cfg.rdzv.master_addr = str(payload["master_addr"])
    cfg.rdzv.master_port = int(payload["master_port"])
    return cfg


def main(argv: List[str]) -> int:
    if not die_with_parent(int(argv[0])):  # the actor that started this node is gone already
        return 1
    # Ray's worker processes ignore SIGINT, and an ignored signal stays ignored across exec; the actor's thread
    # that started this process may block it, and a child inherits that mask too: this node agent must hear
    # Ctrl-C (passed on by the driver) as a node agent in a terminal does
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
    payload = json.loads(sys.stdin.read())
    cfg = node_config(payload)
    attempt = int(payload.get("attempt", 0))
    run_dir = Path(cfg.output_dir) / str(cfg.run_id)
    setup_launcher_logging(None)

    def continuing(_: Path) -> None:  # a re-placed job keeps the previous attempt's rank logs
        if attempt and cfg.rdzv.node_rank == 0:
            log.info(f"Ray placement attempt {attempt}: resuming from the newest checkpoint")
            archive_rank_logs(run_dir, f"ray-attempt-{attempt - 1}")

    try:
        return launch(cfg, process_start_time(), continuing=continuing)
    except LauncherError as e:
        print(f"error: node {cfg.rdzv.node_rank}: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
