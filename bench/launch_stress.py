"""Launch stress: ordinary user scripts launched many times in a row, counting the launches that never
finish (the intermittent hang at exit with forked warm workers, docs/architecture.md) and those that fail.

    python bench/launch_stress.py [--launches 300] [--load] [--torchrun] [--shapes NAME ...]
                                  [--timeout 60] [--json bench/launch_stress.json]

- shapes (default all, launched round-robin, --launches split evenly between them):
  tutorial-gpus2, tutorial-gpus4, tutorial-nodes2 (--nodes 2 --gpus 1), tutorial-spare (the same and --spares 1:
  the spare waits and must end with the job): tests/scripts/stress_ddp_tutorial.py,
  the DDP tutorial's shape (process group destroyed with the DDP model alive);
  results-gpus2, results-gpus4: tests/scripts/stress_results_at_end.py (all_reduce, a little training,
  results written, then destroy_process_group()).
- per shape: launches, hangs (not finished within --timeout s; the process group is then killed),
  failures (non-zero exit, or a rank's result file missing), leftovers (processes still alive after the
  launch exited), masked hangs (finished, but only because our launcher killed a rank that hung after
  its script returned, launcher.exit_timeout_s, 60 s by default; or an exit lag over 30 s), and median
  and max wall seconds of the launches that finished, with their largest exit lag (last result file
  written -> launch ended: a hang is this lag growing without bound).
- --torchrun: every launch of ours is followed by one of `python -m torch.distributed.run` on the same
  script and arguments as the baseline (tutorial-nodes2: two agents, --nnodes 2 --node-rank K
  --master-addr 127.0.0.1 --master-port P), so both see the same machine state.
- --load: one busy-loop CPU burner per core runs alongside for the whole benchmark (started and
  killed here), which widens the timing windows a race at exit needs.
Every process started here runs in its own process group, is bounded by a timeout and is killed by
group. Writes the JSON (--json) and prints a table.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Sequence

import psutil

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "tests" / "scripts"
PR_SET_CHILD_SUBREAPER = 36
LAUNCHERS = ("ours", "torchrun")
SLOW_EXIT_S = 30.0  # exit lag beyond this is a hang cut short (normal: 2-10 s on 2 busy cores)


@dataclass(frozen=True)
class Shape:
    script: str
    nodes: int
    gpus: int
    spares: int = 0  # hot spares (ours: --spares; torchrun's baseline runs the nodes alone)

    @property
    def world(self) -> int:
        return self.nodes * self.gpus


SHAPES: Dict[str, Shape] = {
    "tutorial-gpus2": Shape("stress_ddp_tutorial.py", 1, 2),
    "tutorial-gpus4": Shape("stress_ddp_tutorial.py", 1, 4),
    "tutorial-nodes2": Shape("stress_ddp_tutorial.py", 2, 1),
    "tutorial-spare": Shape("stress_ddp_tutorial.py", 2, 1, spares=1),
    "results-gpus2": Shape("stress_results_at_end.py", 1, 2),
    "results-gpus4": Shape("stress_results_at_end.py", 1, 4),
}


@dataclass
class Tally:
    """One launcher's record on one shape."""

    launches: int = 0
    hangs: int = 0
    failures: int = 0
    leftovers: int = 0
    masked: int = 0
    seconds: List[float] = field(default_factory=list)  # launches that finished (hangs excluded)
    lags: List[float] = field(default_factory=list)  # last result file written -> launch ended, same launches
    bad: List[Dict[str, Any]] = field(default_factory=list)  # what went wrong, launch by launch

    def row(self) -> Dict[str, Any]:
        return {"launches": self.launches, "hangs": self.hangs, "failures": self.failures, "leftovers": self.leftovers,
                "masked_hangs": self.masked, "median_s": statistics.median(self.seconds) if self.seconds else None,
                "max_s": max(self.seconds) if self.seconds else None, "seconds": [round(s, 2) for s in self.seconds],
                "max_exit_lag_s": max(self.lags) if self.lags else None,
                "exit_lags_s": [round(s, 2) for s in self.lags],
                "bad": self.bad}


def _env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC", "SLURM_"))}
    env.setdefault("WANDB_MODE", "offline")
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def commands(launcher: str, shape: Shape, out: Path, runs: Path) -> List[List[str]]:
    """The command lines of one launch: one process, or one torchrun agent per simulated node."""
    script = [str(SCRIPTS / shape.script), str(out)]
    if launcher == "ours":
        nodes = ["--nodes", str(shape.nodes)] if shape.nodes > 1 else []
        nodes += ["--spares", str(shape.spares), "--max-restarts", "1"] if shape.spares else []
        return [[sys.executable, "-m", "launcher", *nodes, "--gpus", str(shape.gpus), f"output_dir={runs}", *script]]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--max-restarts", "0",
                "--nproc-per-node", str(shape.gpus)]
    port = str(_free_port())
    if shape.nodes == 1:
        return [[*torchrun, "--master-addr", "127.0.0.1", "--master-port", port, *script]]
    return [[*torchrun, "--nnodes", str(shape.nodes), "--node-rank", str(k), "--master-addr", "127.0.0.1",
             "--master-port", port, *script] for k in range(shape.nodes)]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _leftovers(spare: Sequence[int]) -> List[psutil.Process]:
    """Our descendants still alive a moment after a launch ended (orphans re-parent to us: subreaper)."""
    alive = [p for p in psutil.Process().children(recursive=True) if p.pid not in spare]
    _, running = psutil.wait_procs(alive, timeout=3)
    left = []
    for p in running:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.NoSuchProcess:
            pass
    return left


def _killed_at_exit(runs: Path) -> List[int]:
    """Ranks our launcher killed for hanging after their script returned (summary.json), if any."""
    killed: List[int] = []
    for summary in runs.glob("*/summary.json"):
        try:
            killed += json.loads(summary.read_text()).get("ranks_killed_at_exit") or []
        except (OSError, ValueError):
            pass
    return killed


def one_launch(launcher: str, shape: Shape, timeout: float, spare: Sequence[int]) -> Dict[str, Any]:
    """Run one launch to completion or timeout; what happened, and how long it took."""
    where = Path(tempfile.mkdtemp(prefix="stress-"))
    out = where / "out"
    out.mkdir()
    start = time.monotonic()
    procs: List[subprocess.Popen] = []
    try:
        for cmd in commands(launcher, shape, out, where / "runs"):
            procs.append(subprocess.Popen(cmd, cwd=where, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          text=True, start_new_session=True))
        hung, errs, codes = False, [], []
        for proc in procs:
            try:
                _, err = proc.communicate(timeout=max(0.1, timeout - (time.monotonic() - start)))
            except subprocess.TimeoutExpired:
                hung = True
                for p in procs:
                    _kill_group(p)
                _, err = proc.communicate()
            errs.append(err or "")
            codes.append(proc.returncode)
        seconds = time.monotonic() - start
        missing = [r for r in range(shape.world) if not (out / f"done-{r}").is_file()]
        lag = None if missing else time.time() - max((out / f"done-{r}").stat().st_mtime for r in range(shape.world))
        killed = _killed_at_exit(where / "runs")
        names = []
        for p in _leftovers(spare):
            try:
                names.append(f"{p.pid} {' '.join(p.cmdline())[:100]}")
                p.kill()
            except psutil.Error:
                pass
    finally:  # also on Ctrl-C: nothing of this launch outlives it
        for proc in procs:
            _kill_group(proc)
        shutil.rmtree(where, ignore_errors=True)
    return {"hung": hung, "failed": not hung and (any(codes) or bool(missing)), "exit_codes": codes,
            "missing_ranks": missing, "leftovers": names, "seconds": seconds, "exit_lag_s": lag,
            "masked": not hung and (bool(killed) or (lag is not None and lag > SLOW_EXIT_S)), "killed_at_exit": killed,
            "stderr_tail": "\n".join("\n".join(e.strip().splitlines()[-10:]) for e in errs)}


def verdict(result: Dict[str, Any]) -> str:
    words = ["HUNG" if result["hung"] else "FAILED" if result["failed"] else "ok"]
    if result["masked"]:
        words.append(f"MASKED HANG (ranks killed at exit: {result['killed_at_exit']})")
    if result["leftovers"]:
        words.append(f"LEFT {len(result['leftovers'])} PROCESSES")
    if result["exit_lag_s"] is not None:
        words.append(f"(exit lag {result['exit_lag_s']:.1f}s)")
    return " ".join(words)


def start_burners() -> List[subprocess.Popen]:
    """One busy-loop process per core, each in its own group; bounded by a timeout of their own too."""
    loop = "import time\nend = time.monotonic() + 6 * 3600\nwhile time.monotonic() < end: pass\n"
    return [subprocess.Popen([sys.executable, "-c", loop], start_new_session=True) for _ in range(os.cpu_count() or 1)]


def run(names: List[str], launches: int, timeout: float, load: bool, torchrun: bool) -> Dict[str, Dict[str, Tally]]:
    tallies = {name: {who: Tally() for who in LAUNCHERS[:1 + torchrun]} for name in names}
    burners = start_burners() if load else []
    spare = [p.pid for p in burners]
    try:
        for n in range(launches):
            name = names[n % len(names)]
            for launcher in tallies[name]:
                result = one_launch(launcher, SHAPES[name], timeout, spare)
                tally = tallies[name][launcher]
                tally.launches += 1
                tally.hangs += result["hung"]
                tally.failures += result["failed"]
                tally.leftovers += bool(result["leftovers"])
                tally.masked += result["masked"]
                if not result["hung"]:
                    tally.seconds.append(result["seconds"])
                    if result["exit_lag_s"] is not None:
                        tally.lags.append(result["exit_lag_s"])
                if result["hung"] or result["failed"] or result["leftovers"] or result["masked"]:
                    tally.bad.append({"iteration": tally.launches, **result})
                print(f"[{n + 1}/{launches}] {name:<16} {launcher:<8} {result['seconds']:6.1f}s {verdict(result)}",
                      file=sys.stderr, flush=True)
    finally:
        for p in burners:
            _kill_group(p)
            p.wait(timeout=10)
    return tallies


def machine() -> str:
    import torch

    return f"{platform.node()}: {os.cpu_count()} cores, torch {torch.__version__}, Python {platform.python_version()}"


def print_table(tallies: Dict[str, Dict[str, Tally]], timeout: float) -> None:
    columns = ("launches", "hangs", "failures", "leftovers", "masked", "median", "max", "max lag")
    print(f"{'shape':<17}{'launcher':<10}" + "".join(f"{c:>10}" for c in columns))
    for name, by_launcher in tallies.items():
        for launcher, t in by_launcher.items():
            med = f"{statistics.median(t.seconds):.1f}s" if t.seconds else "-"
            top = f"{max(t.seconds):.1f}s" if t.seconds else "-"
            lag = f"{max(t.lags):.1f}s" if t.lags else "-"
            cells = (t.launches, t.hangs, t.failures, t.leftovers, t.masked, med, top, lag)
            print(f"{name:<17}{launcher:<10}" + "".join(f"{c:>10}" for c in cells))
    print(f"(hang: not finished within {timeout:.0f}s; masked: finished, but a rank hung at exit until the launcher's"
          f" launcher.exit_timeout_s killed it, or exit lag > {SLOW_EXIT_S:.0f}s; median, max and lag (last result file"
          " written -> launch ended) over the launches that finished)")


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=300,
                        help="launches of ours in total, round-robin over the shapes (torchrun: as many again)")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES), metavar="NAME",
                        help=f"shapes to run (default all: {', '.join(SHAPES)})")
    parser.add_argument("--load", action="store_true", help="one busy-loop CPU burner per core alongside")
    parser.add_argument("--torchrun", action="store_true", help="also launch each with torchrun, as the baseline")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds after which a launch counts as hung")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "launch_stress.json")
    args = parser.parse_args(argv)
    if sys.platform.startswith("linux"):  # orphans of a launch re-parent to us, so leftovers are seen and killed
        ctypes.CDLL("libc.so.6").prctl(PR_SET_CHILD_SUBREAPER, 1)
    started = time.monotonic()
    tallies = run(args.shapes, args.launches, args.timeout, args.load, args.torchrun)
    result = {"machine": machine(), "launches": args.launches, "load": args.load, "timeout_s": args.timeout,
              "wall_s": round(time.monotonic() - started, 1),
              "shapes": {name: {who: t.row() for who, t in by.items()} for name, by in tallies.items()}}
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(result["machine"] + (", under load (one burner per core)" if args.load else ""))
    print_table(tallies, args.timeout)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
