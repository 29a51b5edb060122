"""Our async checkpoint writer against torch's own `torch.distributed.checkpoint.async_save`, same model and state.

    python bench/async_checkpoint.py [--sizes 10,50] [--rounds 2] [--saves 3] [--out bench/async_checkpoint.json]

Each run is 2 fresh ranks (torch.multiprocessing, gloo, CPU, one intra-op thread each) training an MLP of
SIZE million parameters under DDP with AdamW, then saving --saves checkpoints one way:
  ours        trainers' Checkpointer(async_save=True): our stage() copy and BackgroundWriter thread
              (trainers/checkpoint/background.py), then write()
  dcp         dcp.async_save(FileSystemWriter(sync_files=True)) on a gloo group of its own; when its future
              is done, the same publication steps write() takes (rank file, barrier, manifest with SHA-256
              last, one rename, keep-N): the invariants are ours whichever writer wins, so both pay for them
  dcp-cached  the same, with FileSystemWriter(cache_staged_state_dict=True) (one reused staging copy, as ours);
              only where an accelerator is: its staging copy is pinned memory, which torch 2.13 refuses without one
              ("Cannot access accelerator device when none is available")
Per save: blocked = how long the training loop waits in the save call (slowest rank); total = save call to
checkpoint published, the loop waiting for it right away; peak extra memory = the highest RSS sampled (2 ms)
while saving, less the RSS before the first save (largest rank). Medians over saves and rounds; the runs of a
round alternate their order. Printed as ratios dcp/ours. Then every variant saves once more, trains a step
while that write is in flight, and loads the checkpoint into a fresh model and optimizer: it must equal, bit for
bit, the state at the save's step (and the same state for every variant).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

import psutil
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from launcher.trainers.checkpoint import store
from launcher.trainers.checkpoint.background import writer_group
from launcher.trainers.checkpoint.checkpointer import Checkpointer
from launcher.runtime.checkpoints import TMP_PREFIX, step_dir
from launcher.trainers.models import MLP

VARIANTS = ("ours", "dcp", "dcp-cached") if torch.accelerator.is_available() else ("ours", "dcp")
BATCH, IN_DIM, CLASSES = 8, 1024, 10
SHAPES = {10: (1600, 4), 50: (2500, 8)}  # million parameters -> (hidden, depth): 10.3M, 50.1M


class DcpAsyncSaver:
    """What Checkpointer.save would be on dcp.async_save: torch stages and writes, we publish when it is done."""

    def __init__(self, ckpt_dir: Path, keep: int, cached: bool) -> None:
        self.dir, self._keep, self._group = ckpt_dir, keep, writer_group()
        # cache_staged_state_dict keeps one staging copy for every save: the writer must then be reused
        self._writer = dcp_writer(ckpt_dir, cached=True) if cached else None
        self._cached = cached
        self._done: Optional[Future] = None

    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, position: store.Position) -> None:
        import torch.distributed.checkpoint as dcp

        self.wait()
        final, tmp = step_dir(self.dir, position.step), self.dir / f"{TMP_PREFIX}{position.step:08d}"
        if dist.get_rank() == 0:  # DCP's writer threads make it as well
            tmp.mkdir(parents=True, exist_ok=True)  # DCP's writer makes it too, on every rank
        payload = store.rank_payload(position)
        writer = self._writer if self._cached else dcp_writer(tmp)
        upload = dcp.async_save(store.state_dict(model, optimizer), checkpoint_id=str(tmp), storage_writer=writer,
                                process_group=self._group)
        done: Future = Future()
        upload.add_done_callback(lambda f: self._publish(f, done, tmp, final, payload, position))
        self._done = done

    def _publish(self, upload: Future, done: Future, tmp: Path, final: Path, payload: Dict[str, Any],
                 position: store.Position) -> None:
        """write()'s steps after dcp.save, in DCP's thread (a done callback's own error would be lost: kept here)."""
        try:
            upload.result()
            store._save_rank_file(tmp / f"rank-{dist.get_rank()}.pt", payload)
            store._barrier(self._group)
            if dist.get_rank() == 0:
                store._publish(tmp, final, position)
                store.prune(self.dir, self._keep)
            store._barrier(self._group)
            done.set_result(final)
        except BaseException as e:  # DCP's CheckpointException is a BaseException
            done.set_exception(e)

    def wait(self) -> None:
        if self._done is not None:
            done, self._done = self._done, None
            done.result()


def dcp_writer(path: Path, cached: bool = False) -> Any:
    from torch.distributed.checkpoint import FileSystemWriter

    return FileSystemWriter(str(path), sync_files=True, cache_staged_state_dict=cached)


class PeakRss:
    """The highest RSS of this process, sampled every 2 ms in a thread while active."""

    def __init__(self) -> None:
        self._proc, self.peak, self._on = psutil.Process(), 0, threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def rss(self) -> int:
        return self._proc.memory_info().rss

    def _sample(self) -> None:
        while True:
            self._on.wait()
            self.peak = max(self.peak, self.rss())
            time.sleep(0.002)

    def __enter__(self) -> "PeakRss":
        self._on.set()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._on.clear()
        self.peak = max(self.peak, self.rss())


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    gen = torch.Generator().manual_seed(step * 2 + dist.get_rank())
    x, y = torch.randn(BATCH, IN_DIM, generator=gen), torch.randint(0, CLASSES, (BATCH,), generator=gen)
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()


def build(size: int) -> tuple:
    torch.manual_seed(0)
    hidden, depth = SHAPES[size]
    model = torch.nn.parallel.DistributedDataParallel(MLP(IN_DIM, hidden, depth, CLASSES))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def state_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """SHA-256 over every tensor's bytes of model and optimizer state, in key order, and the plain values."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    digest = hashlib.sha256()

    def walk(value: Any, key: str) -> None:
        if isinstance(value, torch.Tensor):
            digest.update(f"{key}:{value.dtype}:{tuple(value.shape)}".encode())
            digest.update(value.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
        elif isinstance(value, dict):
            for k in sorted(value, key=str):
                walk(value[k], f"{key}.{k}")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{key}.{i}")
        else:
            digest.update(f"{key}={value!r}".encode())

    walk(dict(zip(("model", "optim"), get_state_dict(model, optimizer))), "")
    return digest.hexdigest()


def saver_for(variant: str, ckpt_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Any:
    """save(position) and wait() for one variant."""
    if variant == "ours":
        cfg = SimpleNamespace(checkpoint=SimpleNamespace(dir=str(ckpt_dir), every_steps=0, every_seconds=0, keep=2,
                                                         async_save=True))
        ours = Checkpointer(cfg, None, dist.get_rank(), dist.get_world_size(), torch.device("cpu"), model, optimizer)
        return SimpleNamespace(save=ours.save, wait=ours.finish)
    dcp = DcpAsyncSaver(ckpt_dir, 2, cached=variant == "dcp-cached")
    return SimpleNamespace(save=lambda position: dcp.save(model, optimizer, position), wait=dcp.wait)


def worker(rank: int, size: int, variant: str, root: str, saves: int, result: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank, world_size=2)
    model, optimizer = build(size)
    saver = saver_for(variant, Path(root) / "ckpt", model, optimizer)
    step = 0
    for step in range(1, 3):
        train_step(model, optimizer, step)
    rss = PeakRss()
    before, blocked, total = rss.rss(), [], []
    for _ in range(saves):
        step += 1
        train_step(model, optimizer, step)
        dist.barrier()
        with rss:
            t0 = time.perf_counter()
            saver.save(store.Position(step, 0, step))
            t1 = time.perf_counter()
            saver.wait()
            t2 = time.perf_counter()
        blocked.append(t1 - t0)
        total.append(t2 - t0)
    # The check: a step trained while the last write is in flight must not reach that checkpoint.
    step += 1
    train_step(model, optimizer, step)
    expected = state_digest(model, optimizer)
    saver.save(store.Position(step, 0, step))
    train_step(model, optimizer, step + 1)
    saver.wait()
    fresh, fresh_opt = build(size)
    resumed = store.load_latest(Path(root) / "ckpt", fresh, fresh_opt)
    loaded = state_digest(fresh, fresh_opt) if resumed is not None and resumed.position.step == step else "missing"
    Path(f"{result}.{rank}").write_text(json.dumps({
        "blocked_s": blocked, "total_s": total, "extra_bytes": rss.peak - before,
        "expected": expected, "loaded": loaded}))
    dist.destroy_process_group()


def run_once(size: int, variant: str, saves: int) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-async-ckpt-") as root:
        result = os.path.join(root, "result")
        mp.start_processes(worker, args=(size, variant, root, saves, result), nprocs=2, start_method="spawn")
        ranks = [json.loads(Path(f"{result}.{r}").read_text()) for r in range(2)]
    slowest = lambda key: [max(a, b) for a, b in zip(ranks[0][key], ranks[1][key])]  # noqa: E731
    assert all(r["expected"] == r["loaded"] for r in ranks), f"{variant} {size}M: the checkpoint does not load bitwise"
    return {"blocked_s": slowest("blocked_s"), "total_s": slowest("total_s"),
            "extra_bytes": max(r["extra_bytes"] for r in ranks), "digest": ranks[0]["loaded"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="10,50", help="million parameters, among " + ",".join(map(str, SHAPES)))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--saves", type=int, default=3)
    p.add_argument("--out", default="", help="also write the result here as JSON")
    args = p.parse_args()
    report: Dict[str, Any] = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
                              "machine": f"{os.cpu_count()} CPUs, CPU only, gloo, 2 ranks x 1 thread",
                              "rounds": args.rounds, "saves_per_round": args.saves, "sizes": {}}
    if "dcp-cached" not in VARIANTS:
        report["not_run"] = {"dcp-cached": "FileSystemWriter(cache_staged_state_dict=True) pins its staging copy, "
                                           "which torch refuses without an accelerator"}
    for size in (int(s) for s in args.sizes.split(",")):
        runs: Dict[str, List[Dict[str, Any]]] = {v: [] for v in VARIANTS}
        for r in range(args.rounds):
            for variant in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
                runs[variant].append(run_once(size, variant, args.saves))
                print(f"{size}M round {r}: {variant} done", file=sys.stderr, flush=True)
        digests = {run["digest"] for v in VARIANTS for run in runs[v]}
        assert len(digests) == 1, f"{size}M: the variants' checkpoints differ"
        figures = {v: {"blocked_s": statistics.median(x for run in runs[v] for x in run["blocked_s"]),
                       "total_s": statistics.median(x for run in runs[v] for x in run["total_s"]),
                       "extra_mib": statistics.median(run["extra_bytes"] for run in runs[v]) / 2**20}
                   for v in VARIANTS}
        ratios = {v: {k: round(figures[v][k] / figures["ours"][k], 2) if figures["ours"][k] > 0 else None
                      for k in figures[v]} for v in VARIANTS if v != "ours"}
        report["sizes"][f"{size}M"] = {"figures": figures, "ratio_to_ours": ratios, "bitwise_equal": True}
        for v in VARIANTS:
            f = figures[v]
            print(f"{size}M params, {v:10s}: blocked {f['blocked_s'] * 1000:8.1f} ms  total {f['total_s']:6.2f} s  "
                  f"peak extra {f['extra_mib']:7.0f} MiB", flush=True)
        for v, ratio in ratios.items():
            print(f"{size}M params, {v}/ours: blocked x{ratio['blocked_s']}, total x{ratio['total_s']}, "
                  f"peak extra memory x{ratio['extra_mib']}; all checkpoints load bitwise-equal", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
