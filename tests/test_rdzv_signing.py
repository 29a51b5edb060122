"""A multi-machine job's nodes sign what they share at the rendezvous with the job's secret, and refuse
what is not signed with it before anything is unpickled (docs/security.md).

Real node agents on 127.0.0.1, real sockets; a forged state goes in through a plain TCPStore client,
as anyone who can reach the rendezvous port could write it. Every run is bounded, and every launcher's
process group must be empty once it has exited.
"""

from __future__ import annotations

import base64
import datetime
import pickle
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from launcher.agent import signing
from tests.helpers import QUICK, free_port, group_processes, kill_group, start_launcher, wait_gone

pytestmark = pytest.mark.timeout(240)
SECRET_ENV = "LAUNCHER_RDZV_SECRET"
TWO = ["--nodes", "2", "--gpus", "1", "--rdzv-timeout", "30"]

# Each rank writes what it sees of the secret: the agents hold it, the workers never get it.
ENV_SCRIPT = """
import os, sys
from pathlib import Path
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
Path(sys.argv[1], f"rank-{os.environ['RANK']}").write_text(os.environ.get("LAUNCHER_RDZV_SECRET", "none"))
dist.destroy_process_group()
"""


class Forged:
    """Unpickling this creates `marker`: what a forged rendezvous state would do in every node agent."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def c10d(port: int, rdzv_id: str = "signed") -> List[str]:
    return ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", rdzv_id]


def start_node(tmp_path: Path, argv: List[str], secret: Optional[str], runs: str = "runs") -> subprocess.Popen:
    env: Dict[str, str] = {SECRET_ENV: secret} if secret is not None else {}
    return start_launcher([f"output_dir={tmp_path / runs}", *argv], tmp_path, env=env)


def finish(procs: List[subprocess.Popen], timeout: float) -> List[str]:
    """Each launcher's output once it has exited; fails if one overruns or leaves a process in its group."""
    outs, deadline = [], time.monotonic() + timeout
    try:
        for proc in procs:
            try:
                outs.append(proc.communicate(timeout=max(0.1, deadline - time.monotonic()))[0])
            except subprocess.TimeoutExpired:
                raise AssertionError(f"a launcher still runs after {timeout}s") from None
        for proc in procs:
            left = wait_gone(group_processes(proc.pid), timeout=5)
            assert left == [], f"left running after the launcher exited: {left}"
    finally:
        for proc in procs:
            kill_group(proc)
    return outs


def errors(out: str) -> List[str]:
    return [line for line in out.splitlines() if line.startswith("error:")]


# -- sign and verify -------------------------------------------------------------------------
def test_a_signed_value_verifies_with_its_key_and_context():
    blob = signing.sign(b"k1", "ctx", b"payload")
    assert signing.verify(b"k1", "ctx", blob) == b"payload"
    assert signing.is_signed(blob) and not signing.is_signed(b"payload")


@pytest.mark.parametrize("case", ["tampered", "wrong key", "other context", "truncated", "unsigned", "empty"])
def test_a_value_that_is_not_ours_is_refused(case):
    blob = signing.sign(b"k1", "ctx", pickle.dumps({"state": 1}))
    key, context = b"k1", "ctx"
    if case == "tampered":
        blob = blob[:-1] + bytes([blob[-1] ^ 1])
    elif case == "wrong key":
        key = b"k2"
    elif case == "other context":
        context = "ctx2"  # a value replayed under another store key
    elif case == "truncated":
        blob = blob[: len(signing.PREFIX) + 10]
    elif case == "unsigned":
        blob = pickle.dumps({"state": 1})
    else:
        blob = b""
    with pytest.raises(signing.SignatureError):
        signing.verify(key, context, blob)


def test_the_rendezvous_backend_refuses_a_forged_state_before_unpickling_it(tmp_path):
    from launcher.agent.signed_rdzv import SignedBackend, UnsignedStateError

    marker = tmp_path / "pwned"

    class Inner:  # torch's C10dRendezvousBackend, as it returns a state it read
        name = "c10d"

        def get_state(self):
            return pickle.dumps(Forged(marker)), b"token"

        def set_state(self, state, token=None):
            return state, b"token2", True

    backend = SignedBackend(Inner(), b"secret", "127.0.0.1:29400", "job")
    with pytest.raises(UnsignedStateError, match="rendezvous state at 127.0.0.1:29400 is not signed"):
        backend.get_state()
    state, token, written = backend.set_state(b"state")  # our own, signed and verified on the way back
    assert (state, written) == (b"state", True)
    assert not marker.exists()


@pytest.mark.parametrize("found", ["garbage", "reset", "removed"])
def test_a_state_torch_would_take_for_no_rendezvous_yet_is_refused_once_one_was_seen(found):
    from torch.distributed.elastic.rendezvous.api import RendezvousStateError

    from launcher.agent.signed_rdzv import SignedBackend, UnsignedStateError

    class Inner:  # torch's C10dRendezvousBackend after someone wrote over the state
        state = None

        def get_state(self):
            if found == "garbage" and self.state is not None:
                raise RendezvousStateError("The state object is corrupt.")  # torch's, for a value that is not base64
            return None if found == "reset" and self.state is not None else (self.state, b"token")

        def set_state(self, state, token=None):
            self.state = state
            return state, b"token", True

    class Store:  # the raw store under it: check() says whether the state key is there
        def check(self, keys):
            return found != "removed"

    backend = SignedBackend(Inner(), b"secret", "127.0.0.1:29400", "job", store=Store(), own_secret=True)
    assert backend.set_state(b"state")[0] == b"state"  # seen: from now on there is always a signed state
    with pytest.raises(UnsignedStateError, match=r"store at 127.0.0.1:29400 holds a value not signed by this job "
                                                 r"\(another user or process wrote to this job's store\)"):
        backend.get_state()


@pytest.mark.parametrize("own_secret", [True, False], ids=["simulated-nodes", "nodes-on-machines"])
def test_a_handshake_value_not_signed_by_the_job_is_named_for_who_can_have_written_it(own_secret):
    from types import SimpleNamespace

    from launcher.backends.handshake import NodeHandshake
    from launcher.errors import RendezvousAuthError

    plan = SimpleNamespace(rdzv_endpoint="127.0.0.1:29400", rdzv_timeout_s=5, rdzv_id="job", rdzv_backend="static")
    handshake = NodeHandshake(plan, 0, b"secret", own_secret=own_secret)
    assert handshake.verified_json("reference", handshake.signed("reference", '{"token": "t"}')) == {"token": "t"}
    with pytest.raises(RendezvousAuthError) as caught:
        handshake.verified_json("reference", b'{"token": "forged"}')
    said = str(caught.value)
    assert "127.0.0.1:29400" in said
    assert ("another user or process wrote to this job's store" in said) == own_secret, said
    assert ("give every node the same secret" in said) != own_secret, said


def test_the_watchdogs_flags_between_nodes_count_only_when_signed_by_the_job():
    """A hang flag and each node's word that its stacks are dumped (launcher.backends.peer_flags), on a real store:
    a stranger's unsigned value, or one signed with another secret, is no flag; a store gone raises nothing."""
    from types import SimpleNamespace

    from torch.distributed import PrefixStore, TCPStore

    from launcher.backends.handshake import NodeHandshake
    from launcher.backends.peer_flags import PeerFlags

    port = free_port()
    host = TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=5))
    server = PrefixStore("launcher/job/", host)  # where the nodes' handshake keeps this job's values
    plan = SimpleNamespace(rdzv_endpoint=f"127.0.0.1:{port}", rdzv_timeout_s=5, rdzv_id="job", rdzv_backend="static")

    def node(k: int, key: bytes = b"secret") -> PeerFlags:
        return PeerFlags(NodeHandshake(plan, k, key), lambda: k, nodes=2)

    node0, node1, stranger = node(0), node(1), node(1, b"another secret")
    server.add("placed", 2)  # both nodes' workers started
    server.set("hang", b'{"node": 1}')
    stranger.flag_stuck_start()
    assert node0.hang_flagged() is None and not node0.stuck_start_flagged()
    node1.flag_hang()
    assert node0.hang_flagged() == 1 and node1.hang_flagged() is None  # a node does not follow its own flag
    server.set("stacks_dumped/0", b'{"node": 0}')
    assert node1.wait_for_acks(0.3) == 1
    node0.ack_hang()
    started = time.monotonic()
    assert node1.wait_for_acks(10) == 0 and time.monotonic() - started < 1
    del server, host
    assert node0.hang_flagged() is None and node1.wait_for_acks(0.3) == 1  # the host is gone: no flags, no error
    node0.flag_hang()
    node0.ack_hang()


# -- real nodes ------------------------------------------------------------------------------
def test_a_two_node_c10d_job_with_a_secret_completes_and_keeps_it_from_workers_and_records(tmp_path):
    """The same secret in each node's --rdzv-secret-file: node 0's is private (0600), node 1's readable by every user
    (0644), which node 1 warns of, as ssh does of such a key file, and runs."""
    secret = "s3cr3t-" + "ab" * 20
    script = tmp_path / "env.py"
    script.write_text(ENV_SCRIPT)
    port = free_port()
    files = [tmp_path / "private.secret", tmp_path / "open.secret"]
    for path, mode in zip(files, (0o600, 0o644)):
        path.write_text(secret + "\n")
        path.chmod(mode)
    procs = [start_node(tmp_path, [*TWO, *c10d(port), "--rdzv-secret-file", str(path), str(script), str(tmp_path)], None)
             for path in files]
    outs = finish(procs, timeout=150)
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all("no rendezvous secret" not in out for out in outs), outs
    warned = [[line for line in out.splitlines() if "--rdzv-secret-file" in line] for out in outs]
    assert warned[0] == [] and len(warned[1]) == 1, warned
    assert warned[1][0] == (f"warning: --rdzv-secret-file {files[1]} is open to other users (mode 0644): anyone who can "
                            f"read it can join this job or rewrite its rendezvous; make it yours alone: chmod 600 {files[1]}")
    assert sorted(p.read_text() for p in tmp_path.glob("rank-*")) == ["none", "none"]
    recorded = [p for p in (tmp_path / "runs").rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert recorded == [], f"the secret was written to {recorded}"


def test_a_forged_rendezvous_state_is_refused_and_runs_no_code(tmp_path):
    from torch.distributed import TCPStore

    marker, port = tmp_path / "pwned", free_port()
    # node 1 reads the forged state too, unless node 0 has gone first: then it waits out its --rdzv-timeout.
    # 60 s, not 25: in the suite at load 12 node 1's start took longer, and node 0 gave up on it before reading
    argv = [*TWO, "--rdzv-timeout", "60", *c10d(port, "victim"), "trainer.steps=2", *QUICK]
    # each node its own output folder, as on two machines: in a shared one, a node 1 that refused first leaves
    # plan.json behind, and node 0 then refuses the run id as an earlier run's (1 in 30 here) before it reads the state
    node0 = start_node(tmp_path, argv, "the-job-secret", runs="machine0")
    deadline = time.monotonic() + 60
    while True:  # the attacker: a plain store client on the job's rendezvous port
        try:
            attacker = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=2))
            break
        except (RuntimeError, TimeoutError):
            assert node0.poll() is None and time.monotonic() < deadline, "node 0 never listened"
            time.sleep(0.2)
    attacker.set("torch.rendezvous.victim", base64.b64encode(pickle.dumps(Forged(marker))).decode())
    del attacker
    node1 = start_node(tmp_path, argv, "the-job-secret", runs="machine1")
    outs = finish([node0, node1], timeout=180)
    assert not marker.exists(), "the forged state was unpickled"
    assert node0.returncode == 2, outs[0]
    line, = errors(outs[0])
    assert f"rendezvous state at 127.0.0.1:{port} is not signed with this job's secret" in line, outs[0]
    assert node1.returncode != 0, outs[1]
    assert all("Traceback" not in out for out in outs), outs


@pytest.mark.parametrize("second,mode", [("another secret", "c10d"), ("no secret", "c10d"), ("another secret", "static")])
def test_nodes_with_different_secrets_do_not_form_a_job_and_are_told(tmp_path, second, mode):
    port = free_port()

    def argv(rank: int) -> List[str]:
        where = c10d(port) if mode == "c10d" else ["--node-rank", str(rank), "--master-addr", "127.0.0.1",
                                                   "--master-port", str(port)]
        return [*TWO, *where, "trainer.steps=2", *QUICK]

    first = start_node(tmp_path, argv(0), "secret-one")
    time.sleep(1.0)  # the first hosts the store
    other = start_node(tmp_path, argv(1), "secret-two" if second == "another secret" else None)
    outs = finish([first, other], timeout=90)
    assert [first.returncode, other.returncode] == [2, 2], outs
    for out in outs:
        line, = errors(out)
        assert f"at 127.0.0.1:{port}" in line and "give every node the same secret" in line, out
        assert "Traceback" not in out
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("summary.json"))
    warned = [line for line in outs[1].splitlines() if "no rendezvous secret" in line]
    assert len(warned) == (1 if second == "no secret" else 0), outs[1]


# -- where the secret comes from -------------------------------------------------------------
def test_the_secret_file_wins_over_the_environment_and_blank_means_none(tmp_path):
    from launcher.config.rdzv_secret import read_rdzv_secret

    path = tmp_path / "job.secret"
    path.write_text("  from-file\n")
    assert read_rdzv_secret(str(path), {SECRET_ENV: "from-env"}) == b"from-file"
    assert read_rdzv_secret(None, {SECRET_ENV: "from-env"}) == b"from-env"
    assert read_rdzv_secret(None, {SECRET_ENV: "  "}) is None and read_rdzv_secret(None, {}) is None


def test_a_slurm_submission_hands_its_tasks_a_fresh_secret_only_while_sbatch_runs(monkeypatch):
    import os
    import re

    from launcher.backends.slurm.submit import job_secret

    monkeypatch.delenv(SECRET_ENV, raising=False)
    seen = []
    for _ in range(2):
        with job_secret(has_secret=False):  # what sbatch (--export=ALL) passes on to the job's tasks
            seen.append(os.environ[SECRET_ENV])
    assert all(re.fullmatch(r"[0-9a-f]{64}", s) for s in seen) and seen[0] != seen[1]
    assert SECRET_ENV not in os.environ
    with job_secret(has_secret=True):  # the user's own: left to the tasks to read
        assert SECRET_ENV not in os.environ
