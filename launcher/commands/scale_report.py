"""Scaling figures from a sweep's run summaries, and their renderings: JSON rows, Markdown, a plot, a table."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import statistics

from launcher.commands import table

COLUMNS = ("world_size", "nodes", "gpus_per_node", "batch_per_worker", "global_batch", "samples_per_s", "spread",
           "step_time_s_median", "speedup", "scaling_efficiency", "comm_share", "peak_memory_mb")
SUPERLINEAR = 1.05  # an efficiency above this is no scaling a DDP job can have at the same per-worker work


def scaling_efficiency(throughput: float, workers: int, base_throughput: float, base_workers: int) -> float:
    """throughput_N / (N/N0 x throughput_N0): 1.0 is perfect; with N0 = 1 it is throughput_N / (N x throughput_1)."""
    ideal = base_throughput * workers / base_workers
    return throughput / ideal if ideal > 0 else 0.0


def throughputs(rounds: Sequence[Dict[str, Any]], key: str = "samples_per_s") -> List[float]:
    """One figure of every round's summary (0 where a run lacks it)."""
    return [float(s.get(key) or 0.0) for s in rounds]


def spread(values: Sequence[float]) -> float:
    """(largest - smallest) / median of one size's throughput over its rounds: 0 for a single round."""
    middle = statistics.median(values) if values else 0.0
    return (max(values) - min(values)) / middle if len(values) > 1 and middle > 0 else 0.0


def scaling_rows(points: Sequence[Any], summaries: Sequence[Any]) -> List[Dict[str, Any]]:
    """One row per size, efficiency and speedup against the smallest size in the sweep.

    summaries: per point, its runs' summaries (one per round; a single summary is one round). The
    throughput is their median; the efficiency range pairs this size's slowest round with the
    base's fastest and the other way round; an efficiency above SUPERLINEAR is flagged.
    """
    rounds = [[s] if isinstance(s, dict) else list(s) for s in summaries]
    pairs = sorted(zip(points, rounds), key=lambda ps: ps[0].world_size)
    base_point, base_rounds = pairs[0]
    base_all = throughputs(base_rounds)
    base_tput = statistics.median(base_all)
    rows = []
    for point, runs in pairs:
        every = throughputs(runs)
        tput = statistics.median(every)
        summary = runs[len(runs) // 2]
        memory, kind = peak_memory(summary)
        efficiency = scaling_efficiency(tput, point.world_size, base_tput, base_point.world_size)
        low = scaling_efficiency(min(every), point.world_size, max(base_all), base_point.world_size)
        high = scaling_efficiency(max(every), point.world_size, min(base_all), base_point.world_size)
        rows.append({
            "world_size": point.world_size, "nodes": point.nodes, "gpus_per_node": point.gpus,
            "batch_per_worker": point.batch_size, "global_batch": point.batch_size * point.world_size,
            "samples_per_s": tput, "spread": spread(every), "rounds": len(every), "samples_per_s_rounds": every,
            "step_time_s_median": summary.get("step_time_s_median"),
            "speedup": tput / base_tput if base_tput > 0 else 0.0,
            "scaling_efficiency": efficiency, "efficiency_range": [low, high],
            "comm_share": summary.get("comm_share"), "peak_memory_mb": memory, "peak_memory_kind": kind,
            "tokens_per_s": summary.get("tokens_per_s"), "run_id": summary.get("run_id"),
            "flag": plausibility(efficiency, (low, high), point.batch_size, base_point.batch_size,
                                 rounds_range(base_all, "samples/s", base_point.world_size)),
        })
    return rows


def plausibility(efficiency: float, bounds: Sequence[float], batch: int, base_batch: int,
                 base_scatter: str = "") -> Optional[str]:
    """None, or why a superlinear efficiency is not to be believed as scaling. bounds: the efficiency's range over
    the rounds (this size's slowest against the base's fastest, and the other way round); base_scatter: how the
    base size's rounds ranged (rounds_range). Noise is named first: where the range holds 100%, the rounds'
    scatter explains the figure, whatever else changed."""
    if efficiency <= SUPERLINEAR:
        return None
    low, high = bounds
    said = f"{100 * efficiency:.0f}%"
    if low <= 1.0:
        return (f"noise, not scaling ({said}): over the rounds it ranges {100 * low:.0f}% to {100 * high:.0f}%, which "
                f"holds 100%{f' ({base_scatter})' if base_scatter else ''}: the machine's load changed between "
                "rounds and moved the figure, not the job")
    if batch != base_batch:
        return (f"superlinear ({said}, beyond the measurements' spread): the per-worker batch changed ({base_batch} -> "
                f"{batch}), so each worker did different work (e.g. it fit a cache); not a scaling gain")
    return (f"implausible ({said}, beyond the measurements' spread): superlinear at the same per-worker batch and data; "
            "a measuring error or a machine that changed during the sweep, not scaling")


def rounds_range(values: Sequence[float], unit: str, workers: int) -> str:
    """'the 1-worker rounds ranged 93 to 435 samples/s' (empty for a single round)."""
    if len(values) < 2:
        return ""
    return f"the {workers}-worker rounds ranged {min(values):,.0f} to {max(values):,.0f} {unit}"


def spread_text(value: float) -> str:
    """The one way a spread is printed, in the table, its notes and on the console: (largest - smallest) / median
    of a size's rounds, as a percentage, the figure --spread bounds (a target below 1% keeps a digit: not 0%)."""
    return f"{100 * value:.1g}%" if 0 < value < 0.005 else f"{100 * value:.0f}%"


def widest_spread(rows: Sequence[Dict[str, Any]], key: str) -> str:
    """'throughput spread up to 186% (the 1-worker rounds ranged 93 to 435 samples/s)': the table's largest spread
    of the figure efficiency comes from (key), and the size it is."""
    column = "steps_spread" if key == "steps_per_s" else "spread"
    found = [r for r in rows if r.get(column) is not None]
    if not found:
        return "throughput spread unknown"
    row = max(found, key=lambda r: r[column])
    figures = [float(v) for v in row.get(f"{key}_rounds") or [] if v is not None]
    scatter = rounds_range(figures, HEADERS[key], row["world_size"])
    return f"throughput spread up to {spread_text(row[column])}" + (f" ({scatter})" if scatter else "")


def peak_memory(summary: Dict[str, Any]) -> tuple:
    """(MB, what was measured): CUDA's max allocated where a GPU ran, else the processes' peak RSS."""
    if summary.get("cuda_peak_mb") is not None:
        return summary["cuda_peak_mb"], "cuda_max_allocated"
    return summary.get("rss_peak_mb"), "process_rss"


def _fmt(value: Any, column: str) -> str:
    if value is None:
        return "-"
    if column in ("scaling_efficiency", "comm_share"):
        return f"{100 * value:.0f}%"
    if column in ("spread", "steps_spread"):
        return spread_text(value)
    if column == "steps_per_s":
        return f"{value:,.1f}"
    if column == "batch_per_worker" and isinstance(value, float):
        return f"{value:g}"  # a script's, measured: 15.5 when its last batches are short
    if column == "speedup":
        return f"{value:.2f}x"
    if column == "step_time_s_median":
        return f"{1000 * value:.2f} ms"
    if isinstance(value, float):
        return f"{value:,.0f}"
    return str(value)


HEADERS = {"world_size": "workers", "nodes": "nodes", "gpus_per_node": "per node", "batch_per_worker": "batch/worker",
           "global_batch": "global batch", "samples_per_s": "samples/s", "spread": "spread",
           "steps_per_s": "steps/s", "steps_spread": "spread",
           "step_time_s_median": "step time",
           "speedup": "speedup", "scaling_efficiency": "efficiency", "comm_share": "comm share",
           "peak_memory_mb": "peak MB"}


TRAINER_FOOTNOTE = ("Efficiency = throughput_N / (N / N0 x throughput_N0) against the smallest size N0, from the "
                    "median throughput of each size's rounds; spread = (largest - smallest) / median of a size's "
                    "rounds, the figure --spread bounds; peak memory is CUDA max allocated on GPU, process RSS on CPU.")


def title(result: Dict[str, Any]) -> str:
    """What was swept: the scaling kind, and for a script its name and what its efficiency comes from."""
    if not result.get("script"):
        return f"{result['mode']} scaling, {result.get('device_type')}"
    basis = "samples/s" if result.get("efficiency_from") == "samples_per_s" else "steps/s"
    return f"{result['script']}: {result['mode']} scaling, {result.get('device_type')}, efficiency from {basis}"


def render_markdown(result: Dict[str, Any], columns: Sequence[str] = COLUMNS, footnote: str = TRAINER_FOOTNOTE) -> str:
    lines = [f"# Scaling sweep ({title(result)})", ""]
    if result.get("notice"):
        lines += [f"> {result['notice']}", ""]
    lines.append("| " + " | ".join(HEADERS[c] for c in columns) + " |")
    lines.append("|" + "---|" * len(columns))
    for row in result["sizes"]:
        lines.append("| " + " | ".join(_fmt(row.get(c), c) for c in columns) + " |")
    lines += [""] + [f"- {line}" for line in notes(result)]
    lines += ["", footnote, ""]
    return "\n".join(lines)


def notes(result: Dict[str, Any]) -> List[str]:
    """The lines under the table: how noisy the figures are, and what not to believe."""
    said = [result["batch_note"]] if result.get("batch_note") else []
    said += [f"{r['world_size']} workers: {r['flag']}" for r in result["sizes"] if r.get("flag")]
    if result.get("noisy"):
        said.append(result["noisy"])
    return said


def print_table(result: Dict[str, Any], columns: Sequence[str] = COLUMNS) -> None:
    headers = [HEADERS[c] for c in columns]
    table.print_table(headers, [[_fmt(row.get(c), c) for c in columns] for row in result["sizes"]], right=headers,
                      title=f"scaling ({title(result) if result.get('script') else result['mode']})")
    for line in notes(result):
        print(f"scale: {line}", flush=True)


def round_bounds(row: Dict[str, Any], key: str) -> List[float]:
    """A size's slowest and fastest round of the figure key (its median where rounds were not kept)."""
    figures = [float(v) for v in row.get(f"{key}_rounds") or [] if v is not None] or [float(row[key] or 0.0)]
    return [min(figures), max(figures)]


def render_plot(rows: List[Dict[str, Any]], path: Path, mode: str, key: str = "samples_per_s") -> None:
    """scale.png: scale_figure's."""
    fig = scale_figure(rows, mode, key)
    import matplotlib.pyplot as plt  # after the figure chose its backend (Agg)

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def scale_figure(rows: List[Dict[str, Any]], mode: str, key: str = "samples_per_s") -> Any:
    """Throughput (key: samples_per_s, or a script's steps_per_s) and efficiency against workers, with ideal lines,
    each size's median with error bars from its slowest to its fastest round, and every round as a dot.

    The ideal steps/s of a weak-scaling script stays flat: every step does more samples, not more steps.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    workers = [r["world_size"] for r in rows]
    tput = [r[key] for r in rows]
    base_w, base_t = workers[0], tput[0]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    bounds = [round_bounds(r, key) for r in rows]
    ax1.errorbar(workers, tput, yerr=[[t - b[0] for t, b in zip(tput, bounds)], [b[1] - t for t, b in zip(tput, bounds)]],
                 fmt="o-", capsize=4, label="measured (median; bars: slowest to fastest round)")
    dots = [(r["world_size"], float(v)) for r in rows for v in r.get(f"{key}_rounds") or [] if v is not None]
    if dots:
        ax1.plot(*zip(*dots), ".", color="gray", alpha=0.6, label="each round")
    if key == "steps_per_s":
        ax1.plot(workers, [base_t for _ in workers], "--", color="gray", label="ideal (flat)")
    else:
        ax1.plot(workers, [base_t * w / base_w for w in workers], "--", color="gray", label="ideal (linear)")
    ax1.set(xlabel="workers", ylabel=HEADERS[key], title=f"throughput ({mode} scaling)")
    efficiency = [100 * r["scaling_efficiency"] for r in rows]
    ranges = [[100 * v for v in r.get("efficiency_range") or [r["scaling_efficiency"]] * 2] for r in rows]
    ax2.errorbar(workers, efficiency, yerr=[[e - lo for e, (lo, _) in zip(efficiency, ranges)],
                                            [hi - e for e, (_, hi) in zip(efficiency, ranges)]],
                 fmt="o-", capsize=4, label="measured (bars: range over the rounds)")
    ax2.axhline(100, linestyle="--", color="gray", label="ideal (100%)")
    ax2.set(xlabel="workers", ylabel="efficiency %", title="scaling efficiency",
            ylim=(0, max(110, *(hi + 10 for _, hi in ranges))))
    for ax in (ax1, ax2):
        ax.set_xticks(workers)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def optional_float(value: Any) -> Optional[float]:
    return None if value is None else float(value)
