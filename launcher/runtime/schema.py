"""Every record of a run directory, field by field (name, type, unit, meaning), and the run's statuses: the one place
its writers and readers take them from, so a new field is one line here.

- STEP: steps/rank-<k>.jsonl, a script's worker's record about once a second (launcher/worker/progress.py writes it,
  measuring each field that has a `sample`; launcher.steps reads it). A field declared with `rows` or `per_rank`
  reaches metrics.jsonl, W&B, `ls --json` and the board (ROW), one with `summary` reaches summary.json (SUMMARY).
- ROW: a metrics.jsonl row: a script's (launcher.steps.rows), and the fields readers take from the built-in trainer's.
- GOODPUT, FAILURE, ROUND, EVICTED: goodput/<launch>-attempt-<n>.json (rank 0's clock: launcher.runtime.goodput or
  the worker), -failure-<n>.json (the agent's), -round-<n>.json (an elastic job's rendezvous rounds), -evicted-<n>.json
  (a slow node sent away in round n: launcher.agent.eviction).
- NODE: nodes/node-<k>.json, how each node's launcher ended (launcher.backends.node).
- SUMMARY: summary.json (launcher.rundir.finish, with the built-in trainer's figures).

Readers check what they read back with Record.check or Record.read (launcher.runtime.fields). Stdlib only, and no
module of the project but fields.py: a worker executes both into a namespace of their own (launcher.worker.bootstrap).
"""

from __future__ import annotations

import sys
from enum import Enum
from typing import Any, Dict, List, Optional

if "Field" not in globals():  # imported; a worker's bootstrap executes fields.py into this namespace first
    from launcher.runtime.fields import Field, Record

F = Field
STEP_FORMAT = 1  # a step record's "v"
STEPS_DIR, GOODPUT_DIR, NODES_DIR, SERIES_DIR = "steps", "goodput", "nodes", "series"
GOODPUT_RECORD_BYTES = 1024  # an attempt record is rewritten in place, padded to this size: one pwrite per step
MB = 1024.0 * 1024.0


class Status(str, Enum):
    """How a run stands. summary.json and the node records say how it ended (ENDED); `ls` and the board list each
    run as one of LISTED (a hang as failed); a sweep's member is pending until its run starts."""

    COMPLETED = "completed"
    FAILED = "failed"
    HUNG = "hung"  # failed: the hang watchdog stopped it
    INTERRUPTED = "interrupted"  # a signal (Ctrl-C, SIGTERM) stopped it before its last step
    # its scheduler took it back (SLURM's USR2: a preemption, a time limit's warning) after a checkpoint; summary.json's
    # `requeued` says whether the scheduler runs it again (then `ls` shows it running once it does)
    PREEMPTED = "preempted"
    RUNNING = "running"  # a launcher holds its lock now
    DEAD = "dead"  # it started and nobody holds it, but it never wrote how it ended
    UNKNOWN = "unknown"  # its files cannot tell (a SLURM job still queued)
    DAMAGED = "damaged"  # its files cannot be read
    PENDING = "pending"  # a sweep's member not started

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return self.value.__format__(spec)


ENDED = (Status.COMPLETED, Status.FAILED, Status.HUNG, Status.INTERRUPTED, Status.PREEMPTED)
LISTED = (Status.RUNNING, Status.COMPLETED, Status.FAILED, Status.INTERRUPTED, Status.PREEMPTED, Status.DEAD,
          Status.UNKNOWN, Status.DAMAGED)


def proc_mb(key: bytes) -> Optional[float]:
    """A line of this process's /proc/self/status (Linux) in MB: VmRSS, VmHWM."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return None


def cuda_mb(what: str) -> Optional[float]:
    """The CUDA allocator's figure in MB, where the script uses CUDA (torch's own counters: nothing is synchronised)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return getattr(torch.cuda, what)() / MB
    except Exception:  # noqa: BLE001  (a CUDA error belongs to the script's own next call)
        pass
    return None


WANDB_RUN = Record("wandb run", [
    F("id", str, "", "the W&B run's id", size=200),
    F("project", str, "", "its project", size=200),
    F("name", str, "", "its name", size=200),
    F("owner", str, "", "whose run it is: the script's (summary.json only)", size=20),
])

STEP = Record("steps/rank-<k>.jsonl", [
    F("v", int, "", "the record's format: STEP_FORMAT", required=True),
    F("rank", int, "", "the global rank that wrote it", required=True),
    F("attempt", int, "", "the attempt (restart) it belongs to, from 0", required=True),
    F("launch", str, "", "the launch: its launcher's start in ms (goodput's launch key)", required=True, null=True,
      size=32),
    F("t", float, "s", "when it was written (wall time)", required=True),
    F("step", int, "steps", "optimizer steps so far in this attempt", required=True),
    F("steps", int, "steps", "optimizer steps in this window", required=True),
    F("window_s", float, "s", "the window: from the previous record's last step to this one's", required=True),
    F("step_time_s", float, "s", "mean interval between the window's steps"),
    F("step_time_s_median", float, "s", "median interval between the window's steps"),
    F("step_time_s_max", float, "s", "longest interval between the window's steps"),
    F("first_step_at", float, "s", "wall time of the attempt's first step (its first record)"),
    F("rss_peak_mb", float, "MB", "the rank's process: its peak resident memory", sample=lambda: proc_mb(b"VmHWM:"),
      rows="max", summary="max", chart=False),
    F("rss_mb", float, "MB", "the rank's process: its resident memory", sample=lambda: proc_mb(b"VmRSS:"),
      per_rank=True, chart=False),
    F("cuda_mb", float, "MB", "CUDA memory the rank has allocated", sample=lambda: cuda_mb("memory_allocated")),
    F("cuda_peak_mb", float, "MB", "the rank's peak allocated CUDA memory",
      sample=lambda: cuda_mb("max_memory_allocated"), rows="max", per_rank=True, summary="max", chart=False),
    F("batches", float, "batches", "batches the training loop's DataLoader gave in the window", null=True),
    F("batch_size", int, "samples", "that DataLoader's batch size", null=True),
    F("samples", float, "samples", "samples in the window: batches x batch_size (null: unknown)", null=True),
    F("samples_note", str, "", "why samples are unknown", size=200),
    F("wait_s", float, "s", "of a step, the time the rank waited in collectives for the others (DDP's gradient "
      "all-reduce, other collectives sampled: launcher/worker/waits.py)", per_rank=True),
    F("compute_s", float, "s", "of a step, the rest: the rank's own work. The rank the others wait for computes "
      "longest", per_rank=True),
    F("logged", dict, "", "rank 0's launcher.log() values: name -> number (null for nan, inf)", items=float,
      signed=True, size=256),
    F("per_rank", dict, "", "its launcher.log(..., per_rank=True) values", items=float, signed=True, size=256),
    F("wandb", WANDB_RUN, "", "the script's own W&B run, where it started one (rank 0)"),
    F("final", bool, "", "the rank's last record: its script returned"),
])


SERIES = Record("series/rank-<k>.jsonl", [
    F("v", int, "", "the line's format: STEP_FORMAT", required=True),
    F("rank", int, "", "the rank that logged", required=True),
    F("attempt", int, "", "its attempt", required=True),
    F("launch", str, "", "its launch (launcher.runtime.goodput.launch_key)", null=True, size=64),
    F("step", int, "steps", "the step it was logged at: the attempt's optimizer steps so far, or its own step=",
      required=True),
    F("own_step", bool, "", "step was the caller's (launcher.log(..., step=N))"),
    F("per_rank", bool, "", "logged with per_rank=True"),
    F("t", float, "s", "when it was logged (Unix time)", required=True),
    F("values", dict, "", "the call's values: name -> number (null for nan, inf)", items=float, signed=True, size=256,
      required=True),
])


def row_fields() -> List[Field]:
    """What a step-record field adds to a metrics.jsonl row: the job's value (`rows`), each rank's (`per_rank`)."""
    out = []
    for f in STEP.fields.values():
        if f.rows:
            out.append(F(f.name, f.type, f.unit, f"{f.meaning} ({f.rows} over the ranks)", null=True, signed=f.signed,
                         chart=f.chart))
        if f.per_rank:
            out.append(F(f"{f.name}_per_rank", list, f.unit, f"{f.meaning}, each rank's", items=f.type,
                         signed=f.signed, chart=f.chart))
    return out


def summary_fields() -> List[Field]:
    """What a step-record field adds to summary.json: its value over the launch (`summary`)."""
    return [F(f.name, f.type, f.unit, f"{f.meaning} ({f.summary} over the launch)", null=True, signed=f.signed)
            for f in STEP.fields.values() if f.summary]


# A script's launcher.log() values sit beside these in its rows, by their names (one of ours becomes logged/<name>);
# a value logged as "loss", "epoch" or "goodput" fills in the built-in trainer's field of that name (SHARED).
SHARED = ("loss", "epoch", "goodput")
ROW = Record("metrics.jsonl", [
    F("step", int, "steps", "optimizer steps of the launch so far, across restarts (W&B's step axis)"),
    F("attempt", int, "", "the attempt of rank 0's record"),
    F("attempt_step", int, "steps", "optimizer steps in this attempt"),
    F("epoch", int, "", "the built-in trainer's epoch"),
    F("time", float, "s", "when rank 0 wrote its record (wall time)"),
    F("loss", float, "", "the built-in trainer's loss, mean over ranks", null=True, signed=True),
    F("steps_per_s", float, "steps/s", "rank 0's optimizer steps per second in the window"),
    F("step_time_s", float, "s", "rank 0's mean step time in the window"),
    F("samples_per_s", float, "samples/s", "every rank's samples per second, summed", null=True),
    F("goodput", float, "", "the built-in trainer's goodput so far", null=True),
    F("step_time_s_per_rank", list, "s", "each rank's mean step time", items=float, chart=False),
    F("steps_per_rank", list, "steps", "each rank's steps in its attempt", items=int, chart=False),
    F("step_time_spread", float, "", "(slowest - fastest) / median of the ranks' step times", chart=False),
    F("slowest_rank", int, "", "the rank with the longest step time", chart=False),
    F("slowest_rank_lag", float, "", "how much slower than the median it is (0.1: 10%)", chart=False),
    F("straggler_rank", int, "", "the slowest rank where it lags by more than metrics.straggler_fraction (a script's: "
      "the rank that computes longest, once it has for a few windows in a row)", null=True, chart=False),
    F("straggler", str, "", "that rank in words: 'rank 3 (node 1) computes 2.9x longer than the median rank'",
      size=200, chart=False),
], derived=row_fields)

SYSTEM = Record("nodes/system-<node>.jsonl", [
    F("node", int, "", "the node's rank in the job", required=True),
    F("t", float, "s", "when (Unix time)", required=True),
    F("cpu_percent", float, "%", "the machine's CPU use, all cores (100 = every core busy)"),
    F("memory_percent", float, "%", "its memory in use"),
    F("load1", float, "", "its one-minute load average"),
    F("workers_cpu_percent", float, "%", "the node's worker processes' CPU use (100 = one core)"),
    F("workers_rss_mb", float, "MB", "their resident memory, summed"),
])

KEPT = Record("kept", [
    F("step", int, "steps", "the step of the newest published checkpoint", required=True),
    F("at", float, "s", "when its step ended (wall time)", required=True),
    F("block_s", float, "s", "the loop's checkpoint waits up to then", required=True),
])
GOODPUT = Record("goodput/<launch>-attempt-<n>.json", [
    F("first_step_at", float, "s", "wall time of the attempt's first step", null=True),
    F("active_until", float, "s", "the end of its last step or checkpoint wait", null=True),
    F("start_step", int, "steps", "the step it resumed from"),
    F("step", int, "steps", "its last step"),
    F("block_s", float, "s", "seconds its loop waited for checkpoint saves"),
    F("kept", KEPT, "", "what its newest published checkpoint kept", null=True),
    F("marks", dict, "s", "phase -> when it ended, before the first step (launcher.runtime.goodput.PHASES)",
      items=float, size=16),
])
FAILURE = Record("goodput/<launch>-failure-<n>.json", [
    F("detected_at", float, "s", "when the agent saw attempt n fail", required=True),
    F("hang", bool, "", "the hang watchdog stopped it"),
])
ROUND = Record("goodput/<launch>-round-<n>.json", [
    F("round", int, "", "the rendezvous round"),
    F("nodes", list, "", "the nodes in it (host:port)", items=str, required=True),
    F("at", float, "s", "when it formed"),
    F("world_size", int, "", "ranks in it"),
])

EVICTED = Record("goodput/<launch>-evicted-<n>.json", [
    F("rank", int, "", "the straggler rank whose node left for a spare", required=True),
    F("round", int, "", "the rendezvous round it left"),
    F("at", float, "s", "when the agent of rank 0's node said so"),
    F("lagged_s", float, "s", "how long the step rows had named it"),
    F("why", str, "", "the line that said why", size=600),
])

ROOT_CAUSE = Record("root_cause", [
    F("rank", int, "", "the rank that failed first", required=True),
    F("attempt", int, "", "in which attempt"),
    F("log", str, "", "its log, relative to the run directory", size=400),
    F("error_file", str, "", "its error file (torch's @record format), relative to the run directory", size=400),
    F("how", str, "", "killed (by a signal no one sends to stop a job), exited (with a code) or stopped", size=16),
    F("failed_at", float, "s", "when it failed (Unix time, its machine's clock): the first in time is the cause"),
])
NODE = Record("nodes/node-<k>.json", [
    F("status", Status, "", "how this node's launcher ended: one of ENDED"),
    F("error", str, "", "why it did not complete", null=True),
    F("host", str, "", "its host name", size=256),
    F("node_rank", int, "", "its group rank", null=True),
    F("ranks", list, "", "the global ranks it ran", items=int),
    F("restarts", int, "", "restarts it saw"),
    F("root_cause", ROOT_CAUSE, "", "its rank that failed first"),
])

RANKS_BYTES: Dict[str, Any] = dict(items=int, null=True)  # byte counts of every rank (the built-in trainer's footprint)
# The fields every summary.json holds, null where unknown (launcher.rundir.build_summary).
ALWAYS = [
    F("run_id", str, "", "the run's name (its folder's)", null=True),
    F("status", Status, "", "how it ended: one of ENDED", null=True),
    F("world_size", int, "", "ranks of the job (an elastic job's last round's)", null=True),
    F("nodes", int, "", "machines (or simulated nodes) of the job", null=True),
    F("gpus_per_node", (int, list), "", "workers per node (a list where nodes differ)", items=int, null=True),
    F("backend", str, "", "the process group's backend: gloo, nccl", null=True),
    F("device_type", str, "", "cpu or cuda", null=True),
    F("strategy", str, "", "the built-in trainer's strategy (null for a script)", null=True),
    F("model", str, "", "the built-in trainer's model (null for a script)", null=True),
    F("steps", int, "steps", "optimizer steps, every attempt's", null=True),
    F("global_batch_size", int, "samples", "samples per optimizer step, every rank's", null=True),
    F("samples_per_s", float, "samples/s", "the job's throughput", null=True),
    F("step_time_s_median", float, "s", "median step time", null=True),
    F("final_loss", float, "", "the last loss (a script's: the last it logged with launcher.log)", null=True,
      signed=True),
    F("param_checksum", float, "", "sum of the parameters at the end (the built-in trainer)", null=True, signed=True),
    F("time_to_first_step_s", float, "s", "from the launcher's start to the first optimizer step (clocks of two "
      "machines may differ)", null=True, signed=True),
    F("wall_s", float, "s", "this launch's wall time", null=True),
    F("restarts", int, "", "restarts of this launch", null=True),
    F("goodput", float, "", "share of the run's wall time on steps whose progress was kept", null=True),
    F("badput_s", dict, "s", "the rest by cause (launcher.runtime.goodput.CAUSES)", items=float, null=True),
]
SUMMARY_ALWAYS = tuple(f.name for f in ALWAYS)
SUMMARY = Record("summary.json", [
    *ALWAYS,
    # the launcher's, where they apply
    F("script", str, "", "the script or module run (null: the built-in trainer)", null=True),
    F("error", str, "", "why it did not complete: the rank that failed first, and its error", null=True),
    F("root_cause", ROOT_CAUSE, "", "the rank that failed first, its log and error file"),
    F("elastic_nodes", str, "", "an elastic job's nodes: min:max", size=40),
    F("spares", int, "", "hot spare nodes beyond nodes (--spares), waiting to take a lost node's place"),
    F("exit_code", int, "", "the launcher's exit code", signed=True),
    F("hung_at_exit", bool, "", "a rank finished its script but its process did not exit"),
    F("launch_mode", str, "", "how the nodes met: static, c10d, simulated", null=True),
    F("rendezvous", str, "", "torch's rendezvous backend", null=True),
    F("rdzv_endpoint", str, "", "its address", null=True),
    F("node_list", list, "", "every node: host, node rank, its ranks"),
    F("membership_changes", list, "", "an elastic job's nodes leaving or joining: when, who, the world after"),
    F("ranks_killed_at_exit", list, "", "ranks that finished their script but never exited, killed", items=int),
    F("slurm_job_id", str, "", "the SLURM job", size=64),
    F("slurm_requeues", int, "", "times SLURM requeued it (counted in restarts)"),
    F("preempted_at", float, "s", "when its scheduler's warning stopped it (status preempted; wall time)"),
    F("requeued", bool, "", "after a preemption: whether its scheduler runs it again (null: not decided yet)",
      null=True),
    F("cluster", str, "", "the cluster engine that ran it: ray", size=40),
    F("ray_placement", list, "", "each node's Ray node and address"),
    F("ray_replacements", int, "", "placements made again after a node was lost (counted in restarts)"),
    F("lost_nodes", list, "", "why each lost Ray node is gone", items=str),
    F("goodput_s", float, "s", "seconds of kept steps, every launch's"),
    F("badput_phases_s", dict, "s", "start-up, restart and membership time by phase", items=dict),
    F("goodput_wall_s", float, "s", "wall time goodput divides: every launch's"),
    F("goodput_launches", int, "", "launches of the run (resumes, requeues) goodput covers"),
    # a script's, from its step records
    F("steps_per_s", float, "steps/s", "optimizer steps per second, timed windows only"),
    F("step_time_s_per_rank", list, "s", "each rank's mean step time over the job", items=float),
    F("step_time_spread", float, "", "(slowest - fastest) / median of the ranks' step times"),
    F("slowest_rank", int, "", "the rank with the longest step time"),
    F("slowest_rank_lag", float, "", "how much slower than the median it is (0.1: 10%)"),
    F("straggler_rank", int, "", "the slowest rank where it lags by more than metrics.straggler_fraction", null=True),
    F("straggler", str, "", "a script's straggler in words (by what each rank computes over the job)", size=200),
    F("compute_s_per_rank", list, "s", "a script's: each rank's mean compute per step (the rest of it waited)",
      items=float),
    F("wait_s_per_rank", list, "s", "a script's: each rank's mean wait in collectives per step", items=float),
    F("samples_note", str, "", "why samples/s is unknown"),
    F("metrics_note", str, "", "why step figures are missing"),
    F("wandb_run", WANDB_RUN, "", "the script's own W&B run that got the launcher's figures"),
    # the built-in trainer's (launcher.trainers.train): its loop, memory, features
    F("epochs_started", int, "", "epochs the loop began"),
    F("param_checksums", list, "", "each rank's param_checksum", items=float, signed=True),
    F("resumed_from_step", int, "steps", "the checkpoint's step it resumed from", null=True),
    F("stopped_by", str, "", "the signal that stopped it early", null=True),
    F("param_bytes_per_rank", list, "bytes", "parameters each rank holds", **RANKS_BYTES),
    F("grad_bytes_per_rank", list, "bytes", "gradients each rank holds", **RANKS_BYTES),
    F("optimizer_bytes_per_rank", list, "bytes", "optimizer state each rank holds", **RANKS_BYTES),
    F("peak_memory_bytes_per_rank", list, "bytes", "each rank's peak memory (peak_memory_kind)", **RANKS_BYTES),
    F("rss_bytes_per_rank", list, "bytes", "each rank's resident memory at the end", **RANKS_BYTES),
    F("activation_bytes_per_rank", list, "bytes", "activations of one micro-batch, each rank's", **RANKS_BYTES),
    F("cuda_allocated_bytes_per_rank", list, "bytes", "CUDA memory allocated at the end", **RANKS_BYTES),
    F("cuda_reserved_bytes_per_rank", list, "bytes", "CUDA memory reserved at the end", **RANKS_BYTES),
    F("cuda_peak_allocated_bytes_per_rank", list, "bytes", "peak allocated CUDA memory", **RANKS_BYTES),
    F("peak_memory_kind", str, "", "what peak memory measures: process_rss or cuda_max_allocated"),
    F("replica_groups", list, "", "the ranks holding the same model state"),
    F("strategy_note", str, "", "what the strategy did instead, where it could not run as asked", null=True),
    F("processes", int, "", "worker processes"),
    F("tokens_per_s", float, "tokens/s", "the GPT model's throughput"),
    F("step_time_s_wall", float, "s", "seconds per step by the wall clock after warm-up, logging included", null=True),
    F("metrics_overhead_share", float, "", "share of step time spent measuring (the slowest rank's)"),
    F("time_data_s", float, "s", "waiting for data, per step"),
    F("time_forward_s", float, "s", "forward, per step"),
    F("time_backward_s", float, "s", "backward, per step"),
    F("time_optimizer_s", float, "s", "optimizer, per step"),
    F("time_comm_s", float, "s", "DDP's gradient all-reduce, per step"),
    F("comm_share", float, "", "time_comm_s / step time (DDP only)", null=True),
    F("mfu_percent", float, "%", "model FLOPs utilisation (CUDA)"),
    F("flops_per_step", float, "FLOP", "FLOPs of one step"),
    F("peak_flops", float, "FLOP/s", "the device's peak it is measured against"),
    F("mfu_note", str, "", "why MFU is not measured"),
    F("precision", str, "", "fp32, bf16, fp16"),
    F("activation_dtype", str, "", "the dtype of the model's output", null=True),
    F("grad_accum_steps", int, "", "micro-batches per optimizer step"),
    F("micro_batch_size", int, "samples", "samples per micro-batch per rank"),
    F("effective_global_batch_size", int, "samples", "samples per optimizer step"),
    F("activation_checkpointing", bool, "", "activations recomputed in backward"),
    F("compile", bool, "", "torch.compile on"),
    F("first_step_time_s", float, "s", "the first step's time", null=True),
    F("compile_time_s", float, "s", "first step time beyond the steady median (compile on)", null=True),
    F("compiled_graphs", int, "", "graphs dynamo captured", null=True),
    F("max_grad_norm", float, "", "gradient clipping's norm (0: off)"),
    F("grad_norm_first", float, "", "gradient norm at the first step", null=True),
    F("grad_norm_last", float, "", "gradient norm at the last step", null=True),
    F("data_wait_s_median", float, "s", "median wait for a batch", null=True),
    F("data_wait_share", float, "", "share of step time waiting for data", null=True),
    F("loader_num_workers", int, "", "DataLoader worker processes"),
    F("pin_memory", bool, "", "DataLoader pin_memory"),
    F("loss_scale", float, "", "fp16's loss scale", null=True),
    F("checkpoint_async", bool, "", "checkpoints written in the background"),
    F("checkpoint_staged_bytes", int, "bytes", "bytes staged for background checkpoints"),
    F("auto_batch_size", int, "samples", "the batch size data.batch_size=auto chose"),
    F("auto_batch_cap_bytes", int, "bytes", "the memory it fitted into"),
    F("auto_batch_tried", dict, "bytes", "batch size it tried -> bytes a step of it needs (null: out of memory)",
      items=float),
], derived=summary_fields)
