"""The flight recorder's dumps, read back into the hang verdict's first clause (launcher.agent.flight).

The dumps here are torch's own: gloo's recorder (TORCH_FR_BUFFER_SIZE) writes the same format as
NCCL's, so a real two-rank gloo job makes them; NCCL's started/completed states are added to entries
of that exact shape, as NCCL's watchdog sets them (no GPU here: tests/test_hangs_gpu.py runs it on one).
"""

import copy
import pickle
import subprocess
import sys
import textwrap

import pytest

from launcher.agent import flight
from launcher.agent.watchdog import with_recorder
from launcher.plan import FLIGHT_RECORDER_ENV
from tests.helpers import REPO, free_port, launcher_env

pytestmark = pytest.mark.timeout(120)

JOB = textwrap.dedent("""
    import os, sys, time
    import torch, torch.distributed as dist
    import torch.multiprocessing as mp

    def run(rank, out, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TORCH_FR_BUFFER_SIZE="100")
        dist.init_process_group("gloo", rank=rank, world_size=2)
        t = torch.ones(1)
        for _ in range(3):
            dist.all_reduce(t)
        if rank == 0:  # rank 1 never calls the fourth: rank 0 waits in it
            dist.all_reduce(t, async_op=True)
            time.sleep(0.5)
        with open(f"{out}/nccl-trace-rank-{rank}", "wb") as f:
            f.write(torch._C._distributed_c10d._dump_fr_trace())
        os._exit(0)

    if __name__ == "__main__":
        mp.spawn(run, args=(sys.argv[1], sys.argv[2]), nprocs=2, join=True)
""")


@pytest.fixture(scope="module")
def real_dumps(tmp_path_factory):
    out = tmp_path_factory.mktemp("stacks")
    (out / "job.py").write_text(JOB)
    done = subprocess.run([sys.executable, str(out / "job.py"), str(out), str(free_port())], cwd=REPO,
                          env=launcher_env(), capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_a_real_dump_names_the_rank_that_never_joined_and_the_collective(real_dumps):
    traces = flight.read_traces(real_dumps)
    assert sorted(traces) == [0, 1]
    created = traces[0]["entries"][-1]["time_created_ns"]
    assert flight.verdict(traces, now_ns=created + 61 * 10**9) == "rank 1 never joined all_reduce #4 (rank 0 waiting 61s)"


def nccl_like(real_dumps, ranks=4, reached=(812, 812, 812, 811), stuck_at=812):
    """Dumps of the real entries' shape, with NCCL's states: completed up to the stuck one, queued after it."""
    template = flight.read_traces(real_dumps)[0]["entries"][0]
    traces = {}
    for rank in range(ranks):
        entries = []
        for seq in range(805, reached[rank] + 1):
            entry = copy.deepcopy(template)
            entry.update(collective_seq_id=seq, record_id=seq, profiling_name="nccl:all_reduce",
                         time_created_ns=seq * 10**9, state="completed" if seq < stuck_at else "started")
            entries.append(entry)
        traces[rank] = {"version": "2.10", "entries": entries}
    return traces


def test_nccl_states_find_the_earliest_collective_not_completed(real_dumps):
    traces = nccl_like(real_dumps)
    assert flight.verdict(traces, now_ns=873 * 10**9) == "rank 3 never joined all_reduce #812 (ranks 0-2 waiting 61s)"
    ahead = nccl_like(real_dumps, reached=(815, 815, 812, 811))  # ranks 0-1 queued three more behind it
    assert flight.verdict(ahead, now_ns=873 * 10**9).startswith("rank 3 never joined all_reduce #812 (ranks 0-2 ")
    joined = nccl_like(real_dumps, reached=(812, 812, 812, 812))
    assert "every rank joined all_reduce #812, which has not completed" in flight.verdict(joined, now_ns=873 * 10**9)
    done = nccl_like(real_dumps, reached=(811, 811, 811, 811))
    assert flight.verdict(done) is None  # nothing pending: the hang is elsewhere


def test_only_plain_data_is_unpickled_and_a_cut_dump_is_skipped(real_dumps, tmp_path):
    (tmp_path / "nccl-trace-rank-0").write_bytes((real_dumps / "nccl-trace-rank-0").read_bytes())
    (tmp_path / "nccl-trace-rank-1").write_bytes(pickle.dumps({"entries": [], "x": pytest.approx(1)}))  # names a class
    (tmp_path / "nccl-trace-rank-2").write_bytes((real_dumps / "nccl-trace-rank-1").read_bytes()[:100])  # cut short
    (tmp_path / "nccl-pipe-rank-0.pipe").write_text("")
    assert sorted(flight.read_traces(tmp_path)) == [0]


def test_collect_waits_for_the_dumps_of_the_ranks_asked(real_dumps, tmp_path):
    import threading

    (tmp_path / "nccl-pipe-rank-1.pipe").write_text("")  # torch made rank 1's debug pipe: the watchdog asked it
    late = threading.Timer(0.5, lambda: (tmp_path / "nccl-trace-rank-1").write_bytes(
        (real_dumps / "nccl-trace-rank-1").read_bytes()))
    late.start()
    try:
        assert sorted(flight.collect(tmp_path, wait_s=20)) == [1]  # written by NCCL's thread a moment later
    finally:
        late.cancel()
    assert flight.collect(real_dumps, wait_s=20) and flight.collect(tmp_path / "..", wait_s=0) == {}


def test_the_finding_leads_the_verdict_and_the_plan_writes_where_it_is_read():
    verdict = "hang: no progress for over 300s (watchdog.timeout_s): rank 0 stuck 301s in all_reduce (x.py:3)"
    assert with_recorder(verdict, "rank 1 never joined all_reduce #4 (rank 0 waiting 61s)") == (
        "hang: rank 1 never joined all_reduce #4 (rank 0 waiting 61s) (NCCL flight recorder); no progress for over "
        "300s (watchdog.timeout_s): rank 0 stuck 301s in all_reduce (x.py:3)")
    assert with_recorder(verdict, None) == verdict
    assert FLIGHT_RECORDER_ENV["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "STACKS/" + flight.TRACE_PREFIX
