"""`python -m launcher logs` for every run: one rank, all ranks interleaved by arrival time, -f, --grep.

A real two-rank run whose ranks take turns printing (so only the arrival times can put the lines
in order), followed with -f while it runs; a restarted rank's attempts in order; bad input.
"""

import re
import subprocess
import sys
import time

import pytest

from tests.helpers import kill_group, launcher_env, run_launcher, start_launcher

TURNS_SCRIPT = """
import os, pathlib, sys, time
rank, go = int(os.environ["RANK"]), pathlib.Path(sys.argv[1])
print(f"rank {rank} waiting", flush=True)
while not go.exists():
    time.sleep(0.05)
for turn in range(4):
    if turn % 2 == rank:
        print(f"turn {turn} by rank {rank}", flush=True)
    time.sleep(1.0)  # far apart, so that even a loaded machine writes the turns in turn
"""


def one_line_error(result, words):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and words in lines[0], result.stderr


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_all_ranks_interleave_in_time_order_and_follow_ends_with_the_run(tmp_path):
    script, go, runs = tmp_path / "turns.py", tmp_path / "go", tmp_path / "runs"
    script.write_text(TURNS_SCRIPT)
    proc = start_launcher(["--gpus", "2", f"output_dir={runs}", "run_id=turns", str(script), str(go)], cwd=tmp_path)
    follower = None
    try:
        logs = runs / "turns" / "logs"
        deadline = time.monotonic() + 120
        while not all((logs / f"rank-{r}.log").is_file() and "waiting" in (logs / f"rank-{r}.log").read_text()
                      for r in (0, 1)):
            assert time.monotonic() < deadline and proc.poll() is None, "the ranks did not start"
            time.sleep(0.2)
        follower = subprocess.Popen([sys.executable, "-m", "launcher", "logs", "turns", "--output-dir", str(runs),
                                     "--all", "-f"], cwd=tmp_path, env=launcher_env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
        time.sleep(1.0)
        go.write_text("go")
        assert proc.wait(timeout=120) == 0
        followed, err = follower.communicate(timeout=60)  # it ends by itself once the run has ended
        assert follower.returncode == 0, err
    finally:
        kill_group(proc)
        if follower is not None:
            kill_group(follower)
    turns = [f"[rank{t % 2}]: turn {t} by rank {t % 2}" for t in range(4)]
    assert [line for line in followed.splitlines() if "turn" in line] == turns
    assert "[rank0]: rank 0 waiting" in followed and "[rank1]: rank 1 waiting" in followed

    everything = run_launcher(["logs", str(runs / "turns"), "--all"], cwd=tmp_path, timeout=60).stdout
    assert [line for line in everything.splitlines() if "turn" in line] == turns  # by time, not rank by rank
    one = run_launcher(["logs", "turns", "--output-dir", str(runs), "--rank", "1"], cwd=tmp_path, timeout=60).stdout
    assert one.splitlines() == ["rank 1 waiting", "turn 1 by rank 1", "turn 3 by rank 1"]
    grep = run_launcher(["logs", str(runs / "turns"), "--all", "--grep", "turn [23]"], cwd=tmp_path, timeout=60).stdout
    assert grep.splitlines() == turns[2:]
    one_line_error(run_launcher(["logs", str(runs / "turns"), "--rank", "2"], cwd=tmp_path, timeout=60),
                   "--rank 2 is out of range: run turns has ranks 0-1")


MIXED_SCRIPT = """
import os, sys, time
from tqdm import tqdm
rank = int(os.environ["RANK"])
print(f"[rank{rank}]: a warning torch prefixed itself", file=sys.stderr, flush=True)
time.sleep(0.1)
for i in tqdm(range(12), desc=f"bar {rank}", mininterval=0, ascii=True, ncols=60):
    time.sleep(0.03)
    if i % 4 == 0:
        print(f"rank {rank} print {i}", flush=True)
time.sleep(0.1)
sys.stdout.write(f"rank {rank} ends without a newline")
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_all_ranks_show_one_prefix_per_line_and_a_bar_at_its_last_state(tmp_path):
    script = tmp_path / "mixed.py"
    script.write_text(MIXED_SCRIPT)
    done = run_launcher(["--gpus", "2", f"output_dir={tmp_path / 'runs'}", "run_id=mixed", str(script)], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    shown = run_launcher(["logs", str(tmp_path / "runs" / "mixed"), "--all"], cwd=tmp_path, timeout=60).stdout
    assert "\r" not in shown and shown.endswith("\n")
    lines = shown.splitlines()
    assert all(re.fullmatch(r"\[rank[01]\]: (?!.*\[rank).*", line) for line in lines), lines  # one prefix, at the start
    for rank in (0, 1):
        mine = [line.split(": ", 1)[1] for line in lines if line.startswith(f"[rank{rank}]: ")]
        # Each stream in its order. Between stdout and stderr, the order is the one the agent read the two pipes in:
        # on a loaded machine (a fresh-clone suite run) it read the whole bar from stderr before stdout's prints.
        printed = [line for line in mine if line.startswith(f"rank {rank} ")]  # stdout
        assert printed == [*(f"rank {rank} print {i}" for i in (0, 4, 8)), f"rank {rank} ends without a newline"], mine
        errors = [line for line in mine if not line.startswith(f"rank {rank} ")]  # stderr
        assert len(errors) == 2 and errors[0] == "a warning torch prefixed itself", mine
        assert re.fullmatch(rf"bar {rank}: 100%\|#+\| 12/12 \[.*\]", errors[1]), mine  # its updates: only the last
    # the log files stay byte for byte what the ranks wrote: the bar's updates and all. Each stream's bytes whole and
    # in order; between the two streams, again the order the agent read the pipes in (on a loaded machine, a
    # fresh-clone run of 2026-11-27, stdout's first print came before stderr's warning, written 0.1 s earlier)
    log = (tmp_path / "runs" / "mixed" / "logs" / "rank-1.log").read_bytes()
    assert log.count(b"\r") >= 12 and b"[rank1]: a warning torch prefixed itself\n" in log, log
    stdout = [b"rank 1 print 0\n", b"rank 1 print 4\n", b"rank 1 print 8\n", b"rank 1 ends without a newline"]
    at = [log.find(piece) for piece in stdout]
    assert -1 not in at and at == sorted(at), log


def test_a_restarted_rank_prints_its_attempts_in_order(tmp_path):
    run_dir = tmp_path / "r"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "plan.json").write_text('{"world_size": 1, "mode": "single"}')
    for name, text in (("rank-0.attempt-10.log", "third\n"), ("rank-0.log", "first\n"), ("rank-0.attempt-2.log", "second\n")):
        (run_dir / "logs" / name).write_text(text)
    result = run_launcher(["logs", str(run_dir)], cwd=tmp_path, timeout=60)
    assert result.stdout.splitlines() == ["first", "second", "third"], result.stderr


@pytest.mark.parametrize("argv, words", [
    (["logs", "no-such-run"], "no run 'no-such-run': pass a run directory"),
    (["logs", "RUN", "--grep", "("], "--grep (: not a regular expression"),
    (["logs", "RUN", "--rank", "-1"], "--rank -1 is out of range"),
    (["logs", "RUN", "--rank", "1", "--all"], "not allowed with argument"),
    (["logs", "SWEEP"], "holds several runs (a sweep, compare or scale): pass one of them"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, argv, words):
    run_dir = tmp_path / "r"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "plan.json").write_text('{"world_size": 1, "mode": "single"}')
    (run_dir / "logs" / "rank-0.log").write_text("hello\n")
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "sweep.json").write_text('{"kind": "sweep", "members": []}')
    argv = [{"RUN": str(run_dir), "SWEEP": str(tmp_path / "sweep")}.get(a, a) for a in argv]
    one_line_error(run_launcher(argv, cwd=tmp_path, timeout=60), words)
