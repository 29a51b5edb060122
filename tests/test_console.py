"""What a job prints on the console: the ranks' prints and progress bars no more mixed than under torchrun,
per-rank logs byte for byte what each rank wrote, and the job's worker count announced as the job's.
"""

from pathlib import Path

import pytest

from launcher.agent.ranklog import read_times
from tests.helpers import NO_WANDB, run_launcher
from tests.interleaving import OURS, TORCHRUN, measure, run_console

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RANKS, STEPS = 3, 45


def test_prints_and_bars_are_no_more_mixed_than_under_torchrun_and_the_logs_are_exact(tmp_path):
    found = {}
    for how in (OURS, *TORCHRUN):
        where = tmp_path / how.replace(" ", "_")
        where.mkdir()
        console, kept = run_console(how, RANKS, STEPS, where)
        found[how] = measure(console, RANKS, STEPS)
        print(f"{how}: {found[how]}")
    ours, theirs = found[OURS], found["torchrun"]
    assert ours.mixed_row_share <= theirs.mixed_row_share and ours.mixed_piece_share <= theirs.mixed_piece_share, found
    assert ours.mixed_rows == 0 and ours.prints_intact == ours.prints, found  # and in fact: none mixed, none broken
    logs = tmp_path / OURS / "runs" / "mix" / "logs"
    for rank in range(RANKS):  # the log holds both streams as they came; each stream's bytes are the rank's own
        assert streams_of(logs / f"rank-{rank}.log") == {
            "out": (tmp_path / OURS / "kept" / f"rank-{rank}.out").read_bytes(),
            "err": (tmp_path / OURS / "kept" / f"rank-{rank}.err").read_bytes()}


def streams_of(log: Path) -> dict:
    """A rank's log split back into its stdout and stderr bytes by its times file (launcher.agent.streams)."""
    data, times = log.read_bytes(), read_times(log)
    assert times.offsets and times.offsets[0] == 0
    found = {"out": b"", "err": b""}
    for i, start in enumerate(times.offsets):
        found[times.streams[i]] += data[start:times.offsets[i + 1] if i + 1 < len(times.offsets) else len(data)]
    return found


def test_the_worker_count_announced_is_the_jobs(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    result = run_launcher(["--nodes", "2", "--gpus", "1", f"output_dir={tmp_path / 'runs'}", *NO_WANDB, str(script)],
                          cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "[launcher] no CUDA device: running 2 CPU workers (2 nodes x 1) with gloo" in result.stderr, result.stderr
    assert ": 2 workers (2 nodes x 1), gloo" in result.stderr, result.stderr
    assert "1 CPU worker " not in result.stderr and "running 1 CPU" not in result.stderr, result.stderr


def test_a_messages_first_line_is_what_one_line_errors_and_warnings_show():
    from launcher.runtime.formatting import first_line

    store_error = "  TCPStore recvValue failed: Connection closed by peer\nException raised from recvBytes\nframe #0: c10::Error"
    assert first_line(store_error) == "TCPStore recvValue failed: Connection closed by peer"
    assert first_line(ValueError("bad value\n  in: line 2")) == "bad value"
    assert first_line("") == first_line(None) == first_line("\n  \n") == ""
