"""compare.md (a pasteable table) and compare.png (throughput and per-rank memory) from compare.json rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from launcher.commands import table
from launcher.rundir import write_atomic
from launcher.runtime import formatting
from launcher.runtime.schema import Status

MB = 1024 * 1024
HEADER = ("strategy", "status", "processes", "samples/s", "step ms (median)", "final loss",
          "peak MB/rank (max)", "params+grads+optim MB/rank", "comm share", "note")


def state_mb_per_rank(row: Dict[str, Any]) -> Optional[List[float]]:
    """Parameter + gradient + optimizer bytes each rank holds, in MB."""
    parts = [row.get(k) for k in ("param_bytes_per_rank", "grad_bytes_per_rank", "optimizer_bytes_per_rank")]
    if any(p is None for p in parts):
        return None
    return [sum(values) / MB for values in zip(*parts)]


def table_rows(report: Dict[str, Any]) -> List[List[str]]:
    out = []
    for row in report["rows"]:
        state = state_mb_per_rank(row)
        peak = row.get("peak_memory_bytes_per_rank")
        note = row.get("error") if row["status"] != Status.COMPLETED else row.get("strategy_note")
        out.append([
            row["strategy"], row["status"], _fmt(row.get("processes"), "{}"), formatting.rate(row.get("samples_per_s"), "-"),
            _fmt(row.get("step_time_s_median") and row["step_time_s_median"] * 1000, "{:.1f}"),
            formatting.loss(row.get("final_loss"), "-"), _fmt(peak and max(peak) / MB, "{:.0f}"),
            " / ".join(f"{v:.3f}" for v in state) if state else "-",
            formatting.share(row.get("comm_share"), "n/m"),
            (note or "").replace("|", "/"),
        ])
    return out


def markdown(report: Dict[str, Any]) -> str:
    lines = [f"Model {report['model']}, {report['nodes']} node(s) x {report['gpus_per_node']} GPU(s) or CPU workers, "
             f"batch {report['batch_size_per_worker']} per worker, {report['steps']} steps. "
             "Peak memory: CUDA max allocated on GPU, process RSS on CPU. n/m: not measured.", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(report)]
    return "\n".join(lines) + "\n"


def write_reports(report: Dict[str, Any], out_dir: Path) -> str:
    text = markdown(report)
    write_atomic(out_dir / "compare.md", text)
    plot(report, out_dir / "compare.png")
    return text


def print_table(report: Dict[str, Any]) -> None:
    """The same rows as compare.md, in the command line's one table style (launcher.commands.table)."""
    table.print_table(HEADER, table_rows(report), right=HEADER[2:-1])


def plot(report: Dict[str, Any], path: Path) -> None:
    """compare.png: compare_figure's."""
    fig = compare_figure(report)
    import matplotlib.pyplot as plt  # after the figure chose its backend (Agg)

    fig.savefig(path, dpi=100)
    plt.close(fig)


def compare_figure(report: Dict[str, Any]) -> Any:
    """Three panels: throughput, peak memory per rank, and parameter+gradient+optimizer MB per rank (a legend
    names each rank's colour)."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    rows = report["rows"]
    names = [r["strategy"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    axes[0].bar(names, [r.get("samples_per_s") or 0 for r in rows], color="tab:blue")
    axes[0].set_title("throughput (samples/s)")
    _per_rank_bars(axes[1], rows, lambda r: [v / MB for v in r.get("peak_memory_bytes_per_rank") or []], "peak memory per rank (MB)")
    _per_rank_bars(axes[2], rows, lambda r: state_mb_per_rank(r) or [], "params+grads+optimizer per rank (MB)")
    for ax in axes:
        ax.tick_params(axis="x", rotation=30)
    for ax, r in ((axes[0], rows),):
        for i, row in enumerate(r):
            if row["status"] != Status.COMPLETED:
                ax.text(i, 0, row["status"], rotation=90, ha="center", va="bottom", fontsize=8)
    fig.suptitle(f"{report['model']}: {report['nodes']} node(s) x {report['gpus_per_node']}")
    fig.tight_layout()
    return fig


def _per_rank_bars(ax: Any, rows: List[Dict[str, Any]], values: Any, title: str) -> None:
    """One bar per rank, grouped by strategy: sharding shows as shorter bars per rank; the legend says which colour
    is which rank."""
    ranks = max((len(values(r)) for r in rows), default=1)
    width = 0.8 / max(1, ranks)
    labelled = set()
    for i, row in enumerate(rows):
        for k, v in enumerate(values(row)):
            label = f"rank {k}" if k not in labelled else None
            labelled.add(k)
            ax.bar(i - 0.4 + width * (k + 0.5), v, width, color=f"C{k % 10}", label=label)
    ax.set_xticks(range(len(rows)), [r["strategy"] for r in rows])
    ax.set_title(title)
    if labelled:
        ax.legend(fontsize=8, ncol=min(4, len(labelled)))


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else spec.format(value)
