"""Pure units of the metrics, MFU, progress and scaling-report logic."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from launcher.errors import ConfigError
from tests.helpers import REPO, launcher_env
from launcher.commands.compare_report import compare_figure
from launcher.commands.scale import build_points, capacity_notice, noisy_line, parse_sizes
from launcher.commands.scale_report import render_markdown, render_plot, scale_figure, scaling_efficiency, scaling_rows
from launcher.trainers.metrics.steps import count_tokens
from launcher.runtime.stragglers import stragglers
from launcher.trainers.metrics.mfu import mfu_figures, mfu_percent, peak_flops, FlopCount
from launcher.trainers.metrics.progress import Pace, format_eta
from launcher.runtime.wandb_logger import RUN_ID_FILE, read_or_create_run_id


def test_scaling_efficiency_is_throughput_over_n_times_base():
    assert scaling_efficiency(1800.0, 2, 1000.0, 1) == pytest.approx(0.9)
    assert scaling_efficiency(4000.0, 4, 1000.0, 1) == pytest.approx(1.0)
    assert scaling_efficiency(1500.0, 4, 1000.0, 2) == pytest.approx(0.75)  # base is the smallest size


def test_strong_scaling_keeps_the_global_batch_and_weak_keeps_the_per_worker_batch():
    strong = build_points([1, 2, 4], [1], "strong", 32)
    assert [(p.world_size, p.batch_size) for p in strong] == [(1, 32), (2, 16), (4, 8)]
    weak = build_points([1, 2, 4], [1], "weak", 32)
    assert [(p.world_size, p.batch_size) for p in weak] == [(1, 32), (2, 32), (4, 32)]
    with pytest.raises(ConfigError, match="cannot split evenly"):
        build_points([1, 3], [1], "strong", 32)
    nodes = build_points([1, 2], [1, 2], "weak", 32)  # every node count x every worker count
    assert [(p.nodes, p.gpus, p.world_size) for p in nodes] == [(1, 1, 1), (1, 2, 2), (2, 1, 2), (2, 2, 4)]
    with pytest.raises(ConfigError, match="--gpus 1,2,4"):
        parse_sizes("one,two", "--gpus")


def test_scaling_rows_report_and_plot(tmp_path):
    points = build_points([1, 2], [1], "weak", 8)
    summaries = [{"samples_per_s": 1000.0, "step_time_s_median": 0.008, "comm_share": 0.0, "rss_peak_mb": 300.0},
                 {"samples_per_s": 1500.0, "step_time_s_median": 0.011, "comm_share": 0.4, "rss_peak_mb": 310.0}]
    rows = scaling_rows(points, summaries)
    assert [r["scaling_efficiency"] for r in rows] == pytest.approx([1.0, 0.75])
    assert [r["speedup"] for r in rows] == pytest.approx([1.0, 1.5])
    assert rows[1]["peak_memory_mb"] == 310.0 and rows[1]["peak_memory_kind"] == "process_rss"
    md = render_markdown({"mode": "weak", "device_type": "cpu", "notice": "note: x", "sizes": rows})
    assert "| 2 | 1 | 2 | 8 | 16 | 1,500 | 0% | 11.00 ms | 1.50x | 75% | 40% | 310 |" in md and "> note: x" in md
    render_plot(rows, tmp_path / "scale.png", "weak")
    assert (tmp_path / "scale.png").read_bytes()[:4] == b"\x89PNG"
    json.dumps(rows)  # scale.json must be plain JSON


def test_rounds_give_a_median_a_spread_and_an_efficiency_range():
    points = build_points([1, 2], [1], "weak", 8)
    rounds = [[{"samples_per_s": v} for v in (900.0, 1000.0, 1100.0)], [{"samples_per_s": v} for v in (1500.0, 1800.0, 1600.0)]]
    base, two = scaling_rows(points, rounds)
    assert (base["samples_per_s"], two["samples_per_s"]) == (1000.0, 1600.0) and two["rounds"] == 3
    assert base["spread"] == pytest.approx(0.2) and two["spread"] == pytest.approx(300 / 1600)
    assert two["scaling_efficiency"] == pytest.approx(0.8)
    assert two["efficiency_range"] == pytest.approx([1500 / 2200, 1800 / 1800])  # slowest vs fastest base, and back
    assert two["flag"] is None
    # one spread figure, printed one way: the table's column is the note's figure, (largest - smallest) / median
    noisy = noisy_line([base, two], "samples_per_s", 3, 0.1)
    assert noisy.startswith("noisy: throughput spread up to 20% (the 1-worker rounds ranged 900 to 1,100 samples/s) "
                            "after 3 rounds, above the 10% target (--spread)"), noisy
    md = render_markdown({"mode": "weak", "device_type": "cpu", "notice": None, "sizes": [base, two], "noisy": noisy})
    assert "| 1,000 | 20% |" in md and "| 1,600 | 19% |" in md and f"- {noisy}" in md
    assert "±" not in md and "spread = (largest - smallest) / median" in md


def test_a_superlinear_efficiency_is_flagged_and_explained():
    weak = build_points([1, 2], [1], "weak", 8)
    base, two = scaling_rows(weak, [{"samples_per_s": 1000.0}, {"samples_per_s": 2600.0}])
    assert two["scaling_efficiency"] == pytest.approx(1.3)
    assert two["flag"].startswith("implausible (130%, beyond the measurements' spread)") and base["flag"] is None
    noisy = scaling_rows(weak, [[{"samples_per_s": v} for v in (800.0, 1000.0, 1400.0)],
                                [{"samples_per_s": v} for v in (2200.0, 2300.0, 2400.0)]])[1]
    assert noisy["flag"].startswith("noise, not scaling (115%): over the rounds it ranges 79% to 150%, which holds 100% "
                                    "(the 1-worker rounds ranged 800 to 1,400 samples/s)"), noisy["flag"]
    strong = build_points([1, 2], [1], "strong", 32)  # 32 -> 16 per worker: another workload per worker
    two = scaling_rows(strong, [{"samples_per_s": 1000.0}, {"samples_per_s": 2600.0}])[1]
    assert "the per-worker batch changed (32 -> 16)" in two["flag"]
    # issue 44's sweep: 1-worker rounds from 93 to 435 samples/s under strong scaling: noise is named, not a cache
    scattered = scaling_rows(strong, [[{"samples_per_s": v} for v in (93.0, 435.0, 210.0)],
                                      [{"samples_per_s": v} for v in (480.0, 520.0, 500.0)]])[1]
    assert scattered["flag"].startswith("noise, not scaling (119%)") and "cache" not in scattered["flag"]
    assert "the 1-worker rounds ranged 93 to 435 samples/s" in scattered["flag"]
    assert scaling_rows(weak, [{"samples_per_s": 1000.0}, {"samples_per_s": 2080.0}])[1]["flag"] is None  # 104%: noise
    md = render_markdown({"mode": "weak", "device_type": "cpu", "notice": None,
                          "sizes": scaling_rows(weak, [{"samples_per_s": 1000.0}, {"samples_per_s": 2600.0}])})
    assert "- 2 workers: implausible (130%" in md


def test_scale_png_has_error_bars_from_the_rounds_and_compare_png_a_legend_of_ranks():
    points = build_points([1, 2], [1], "weak", 8)
    rows = scaling_rows(points, [[{"samples_per_s": v} for v in (900.0, 1000.0, 1100.0)],
                                 [{"samples_per_s": v} for v in (1500.0, 1800.0, 1600.0)]])
    fig = scale_figure(rows, "weak")
    throughput, efficiency = fig.axes
    (bars,) = throughput.containers  # matplotlib's ErrorbarContainer: (line, caps, vertical segments)
    spans = [sorted(seg[:, 1]) for seg in bars.lines[2][0].get_segments()]
    assert spans == [pytest.approx([900.0, 1100.0]), pytest.approx([1500.0, 1800.0])]
    ((low, high),) = [sorted(seg[:, 1]) for seg in efficiency.containers[0].lines[2][0].get_segments()][1:]
    assert (low, high) == pytest.approx([100 * 1500 / 2200, 100.0])
    labels = [t.get_text() for t in throughput.get_legend().get_texts()]
    assert "measured (median; bars: slowest to fastest round)" in labels and "each round" in labels
    report = {"model": "mlp", "nodes": 1, "gpus_per_node": 2, "rows": [
        {"strategy": s, "status": "completed", "samples_per_s": 100.0, "peak_memory_bytes_per_rank": [2**20, 2**21],
         "param_bytes_per_rank": [1, 1], "grad_bytes_per_rank": [1, 1], "optimizer_bytes_per_rank": [1, 1]}
        for s in ("ddp", "fsdp")]}
    memory = compare_figure(report).axes[1]
    assert [t.get_text() for t in memory.get_legend().get_texts()] == ["rank 0", "rank 1"]


def test_capacity_notice_says_when_the_machine_cannot_show_scaling():
    assert "share cores" in capacity_notice(4, cores=2, cuda_devices=0)
    assert "overhead, not scaling" in capacity_notice(2, cores=2, cuda_devices=0)
    assert capacity_notice(4, cores=2, cuda_devices=4) is None


def test_stragglers_name_the_slowest_rank_only_past_the_fraction():
    out = stragglers([0.10, 0.10, 0.10, 0.15], 0.2)
    assert out["slowest_rank"] == 3 and out["straggler_rank"] == 3
    assert out["step_time_spread"] == pytest.approx(0.5)
    assert stragglers([0.10, 0.10, 0.11, 0.10], 0.2)["straggler_rank"] is None


def test_mfu_is_never_outside_0_to_100_and_unknown_peaks_are_explained():
    assert mfu_percent(1e12, 1.0, 4e12) == pytest.approx(25.0)
    assert mfu_percent(5e12, 1.0, 4e12) is None  # would be 125%
    assert mfu_percent(0, 1.0, 4e12) is None
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(989.4e12)
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == pytest.approx(756e12)
    assert peak_flops("Some Future GPU", "bf16") is None
    assert "CUDA devices only" in mfu_figures(FlopCount(enabled=False), 0.1, torch.device("cpu"))["mfu_note"]


def test_tokens_are_counted_for_token_id_inputs_only():
    assert count_tokens(torch.zeros(4, 128, dtype=torch.long)) == 512
    assert count_tokens(torch.zeros(4, 32)) is None


def test_eta_is_the_steps_pace_not_the_start_ups():
    pace = Pace()  # the first line: 12 s of start-up before step 10 count for nothing, its window's step time does
    assert pace.eta(10, 100, step_time_s=0.02, now=12.0) == pytest.approx(1.8)
    assert pace.eta(20, 100, step_time_s=0.5, now=12.2) == pytest.approx(1.6)  # then the steps since the first line
    assert Pace().eta(10, 100, now=1.0) is None
    assert format_eta(45.0) == "0:45" and format_eta(3725) == "1:02:05" and format_eta(None) == "?"


def test_wandb_run_id_is_created_once_and_reused(tmp_path):
    first = read_or_create_run_id(tmp_path)
    assert (tmp_path / RUN_ID_FILE).read_text().strip() == first
    assert read_or_create_run_id(tmp_path) == first


@pytest.mark.gpu
def test_mfu_on_gpu_is_a_percentage():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    count = FlopCount(enabled=True)
    model = torch.nn.Linear(1024, 1024).cuda()
    count.begin()
    model(torch.randn(256, 1024, device="cuda")).sum().backward()
    count.finish()
    figures = mfu_figures(count, 0.01, torch.device("cuda"))
    assert "mfu_note" in figures or 0 <= figures["mfu_percent"] <= 100


def test_peak_rss_is_the_kernels_high_water_mark_and_catches_a_peak_between_samples():
    """A 400 MB tensor freed again before anyone looks: sampling the RSS would miss it, the peak does not."""
    code = textwrap.dedent("""
        import torch
        from launcher.trainers.metrics.footprint import PeakMemory, rss_peak_bytes
        memory = PeakMemory(torch.device("cpu"))
        before = memory.peak_bytes()
        x = torch.ones(100 * 1024 * 1024)  # 400 MB, touched
        del x
        print(before, memory.peak_bytes(), rss_peak_bytes())
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=launcher_env(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    before, after, again = (int(v) for v in out.stdout.split())
    assert after - before >= 380 * 1024 * 1024
    assert again == after
