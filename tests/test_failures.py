"""Which failed rank the launcher blames: pure ordering logic over torch's failure records."""

import os
import signal
from types import SimpleNamespace

from launcher.agent.failures import root_cause


def failure(tmp_path, exitcode, error_at=None):
    """A record as torch's agent reports it; error_at: the ns mtime of its error file (None: no file)."""
    error_file = ""
    if error_at is not None:
        error_file = tmp_path / f"error-{error_at}.json"
        error_file.write_text("{}")
        os.utime(error_file, ns=(error_at, error_at))
    return SimpleNamespace(exitcode=exitcode, error_file=str(error_file), timestamp=1000)


def test_the_first_recorded_error_beats_peers_that_failed_after_it(tmp_path):
    failures = {0: failure(tmp_path, 1, error_at=2_000_000_500), 1: failure(tmp_path, 1, error_at=2_000_000_100)}
    assert root_cause(failures)[0] == 1


def test_a_rank_killed_by_sigkill_is_the_cause(tmp_path):
    failures = {0: failure(tmp_path, 1, error_at=1_000), 1: failure(tmp_path, -signal.SIGKILL)}
    assert root_cause(failures)[0] == 1


def test_ranks_stopped_with_sigterm_are_bystanders(tmp_path):
    """The agent SIGTERMs the rest of the group after a failure; those are never the cause."""
    assert root_cause({0: failure(tmp_path, -signal.SIGTERM), 1: failure(tmp_path, 1, error_at=5_000)})[0] == 1
    assert root_cause({0: failure(tmp_path, 3), 1: failure(tmp_path, -signal.SIGTERM)})[0] == 0


def test_the_rank_that_failed_first_in_time_is_the_cause_though_only_its_peer_recorded_an_error(tmp_path):
    """sys.exit(3) writes no error file; the peer that then failed on the closed connection writes one."""
    failures = {0: failure(tmp_path, 1, error_at=2_000_000_000), 1: failure(tmp_path, 3)}
    assert root_cause(failures, {0: 100.05, 1: 100.0})[0] == 1
    assert root_cause(failures, {0: 100.0, 1: 100.05})[0] == 0


def test_across_nodes_the_earliest_cause_is_the_jobs_and_a_kill_comes_first():
    from launcher.agent.failures import first_cause

    node0 = {"rank": 0, "how": "exited", "failed_at": 100.05}
    node1 = {"rank": 3, "how": "exited", "failed_at": 100.0}
    assert first_cause([node0, node1, None]) is node1
    killed = {"rank": 2, "how": "killed", "failed_at": 100.04}  # reaped up to 50 ms after it died
    assert first_cause([node0, node1, killed]) is killed
    older = {"rank": 1}  # a record from before failed_at was written: after every timed one
    assert first_cause([older, node0]) is node0 and first_cause([older]) is older
    assert first_cause([None, {"rank": "x"}]) is None
