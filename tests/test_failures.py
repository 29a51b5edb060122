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
