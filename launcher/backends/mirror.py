"""One view of a multi-machine job without a shared filesystem: the other nodes' rank logs, step records, stack
dumps and node records reach the head's run directory while the job runs, through the job's handshake store.

The head (the node that hosts the store and reports the job) writes a token file into its run directory and
puts the token in the store; a node that finds the same token in its own run directory shares the folder and
ships nothing (one machine, NFS, SLURM's shared filesystem). Any other node runs a Sender: a thread that about
once a second reads what its files gained (launcher.backends.mirror_files) and puts it under its own keys as
a batch, at most MAX_IN_FLIGHT batches ahead of the head (the store holds a bounded amount whatever a rank
prints: a backlog waits in the files themselves). The head's Receiver thread applies each batch in order and
removes it from the store. Every batch is signed with the job's rendezvous secret (launcher.agent.signing),
and no path in one is trusted (mirror_files.Copies). Shipping never fails the job: a store gone, a disk full,
a folder shared after all each stop it with one line in the node's log.
"""

from __future__ import annotations

import datetime
import logging
import os
import secrets
import threading
import time
from typing import Any, Callable, List, Optional

from launcher.agent import signing
from launcher.backends.mirror_files import Copies, SharedFolder, Tails
from launcher.runtime import safefs
from launcher.runtime.formatting import first_line

log = logging.getLogger("launcher")
TOKEN_FILE = ".head-token"  # in the head's run directory while the job runs
INTERVAL_S = 1.0  # how often a sender looks at its files (and the receiver at the store: half that)
MAX_IN_FLIGHT = 4  # batches a sender puts before the head has applied them
END_WAIT_S = 5.0  # at the job's end, how long one side waits for the other's last batches
BYE = "bye"  # a sender read its last ack: the head, which hosts the store, may end
BYE_WAIT_S = 2.0
STORE_TIMEOUT_S = 10.0
Store = Any  # a torch.distributed Store


def client(host: str, port: int, prefix: str) -> Store:
    """The mirror's own client of the store: its thread never waits behind the agent's calls."""
    from torch.distributed import PrefixStore, TCPStore

    raw = TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))
    return PrefixStore(prefix, raw)


class _Side:
    """What both sides share: the store, the signing and the thread that stops on close()."""

    def __init__(self, connect: Callable[[], Store], key: Optional[bytes], context: str, run_dir: str) -> None:
        self.connect, self.key, self.context, self.run_dir = connect, key, context, run_dir
        self.store: Store = None
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._main, name=f"launcher-mirror-{type(self).__name__}", daemon=True)

    def _dump(self, name: str, payload: bytes) -> bytes:
        return signing.sign(self.key, self.context + name, payload) if self.key else payload

    def _load(self, name: str, blob: bytes) -> bytes:
        """Raises signing.SignatureError for a value this job did not write (or, without a secret, one signed)."""
        if self.key:
            return signing.verify(self.key, self.context + name, blob)
        if signing.is_signed(blob):
            raise signing.SignatureError("signed with a secret this node was not given")
        return bytes(blob)

    def _main(self) -> None:
        try:
            self.store = self.connect()
            self.loop()
        except Exception as e:  # the store gone (its host ended), the disk full: the job goes on without it
            if not self.halt.is_set():
                log.warning(f"copying the other nodes' logs to the head stopped: {e.__class__.__name__}: {first_line(e)}")

    def loop(self) -> None:
        raise NotImplementedError

    def start(self) -> "_Side":
        self.thread.start()
        return self


class Sender(_Side):
    """A node other than the head: ships its files unless it finds the head's token in its own run directory."""

    def __init__(self, connect: Callable[[], Store], key: Optional[bytes], context: str, run_dir: str,
                 token_wait_s: float) -> None:
        super().__init__(connect, key, context, run_dir)
        self.tails = Tails(run_dir)
        self.token_wait_s = token_wait_s
        self.me: Optional[int] = None  # this sender's number at the head, once it ships
        self.posted = 0
        self.shared = False  # the head writes this node's run directory itself: nothing is to be sent

    def loop(self) -> None:
        if self._shares_folder():
            return
        self.me = int(self.store.add("senders", 1))
        log.info("this node's run directory is not the head's: its ranks' logs and records are copied there")
        while not self.halt.wait(INTERVAL_S):
            if self.store.check([f"{self.me}/shared"]):
                log.info("the head sees this node's files in its own run directory: nothing more is copied")
                self.shared = True
                return
            self._post_some(deadline=time.monotonic())

    def _shares_folder(self) -> bool:
        deadline = time.monotonic() + self.token_wait_s
        while not self.store.check(["token"]):
            if self.halt.wait(0.2) or time.monotonic() > deadline:
                return True  # no head said where it is: ship nothing rather than guess
        token = self._load("token", self.store.get("token"))
        try:
            self.shared = safefs.read_bytes(os.path.join(self.run_dir, TOKEN_FILE), root=self.run_dir) == token
        except OSError:
            self.shared = False
        return self.shared

    def _post_some(self, deadline: float) -> bool:
        """Post batches while the head keeps up (until deadline); True once nothing is left to post."""
        while True:
            if self.posted - int(self.store.add(f"{self.me}/acked", 0)) >= MAX_IN_FLIGHT:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.05)
                continue
            blob = self.tails.batch()
            if blob is None:
                return True
            name = f"{self.me}/{self.posted + 1}"
            self.store.set(name, self._dump(name, blob))
            self.posted = int(self.store.add(f"{self.me}/posted", 1))

    def close(self, wait_s: float = END_WAIT_S) -> bool:
        """At the node's end: post what is left, say so, wait (bounded) for the head to apply it. Never raises.
        True once the head has every file of this node (all applied, or its own folder): this one may go."""
        self.halt.set()
        self.thread.join(timeout=wait_s)
        if self.me is None or self.store is None or self.thread.is_alive():  # stuck in a store call: its host is gone
            return self.shared
        deadline = time.monotonic() + wait_s
        try:
            if self.store.check([f"{self.me}/shared"]):
                return True
            if not self._post_some(deadline):
                return False
            self.store.set(f"{self.me}/done", self._dump(f"{self.me}/done", str(self.posted).encode()))
            while int(self.store.add(f"{self.me}/acked", 0)) < self.posted and time.monotonic() < deadline:
                time.sleep(0.05)
            complete = int(self.store.add(f"{self.me}/acked", 0)) >= self.posted
        except Exception as e:  # the head's store is gone: what was applied is there
            log.warning(f"copying this node's last log lines to the head failed: {e.__class__.__name__}: {first_line(e)}")
            return False
        try:  # the head may go now: it waits for this, so no call above met a store whose host had just ended
            self.store.set(f"{self.me}/{BYE}", "1")
        except Exception as e:  # the head stopped waiting: everything was applied all the same
            log.debug(f"telling the head this node is done failed: {e!r}")
        return complete


class Receiver(_Side):
    """The head: writes the token, then applies every sender's batches in order into its run directory."""

    def __init__(self, connect: Callable[[], Store], key: Optional[bytes], context: str, run_dir: str) -> None:
        super().__init__(connect, key, context, run_dir)
        self.copies = Copies(run_dir)
        self.applied: List[int] = []  # per sender: batches applied
        self.stopped: List[bool] = []  # per sender: no longer applied (a shared folder, a refused batch)
        self.lock = threading.Lock()

    def loop(self) -> None:
        token = secrets.token_hex(16).encode()
        with safefs.open_file(os.path.join(self.run_dir, TOKEN_FILE), "wb", root=self.run_dir) as f:
            f.write(token)
        self.store.set("token", self._dump("token", token))
        while not self.halt.wait(INTERVAL_S / 2):
            with self.lock:
                self.apply_posted()

    def apply_posted(self) -> None:
        senders = int(self.store.add("senders", 0))
        self.applied += [0] * (senders - len(self.applied))
        self.stopped += [False] * (senders - len(self.stopped))
        for k in range(senders):
            me = k + 1
            while not self.stopped[k] and self.applied[k] < int(self.store.add(f"{me}/posted", 0)):
                name = f"{me}/{self.applied[k] + 1}"
                self._apply(k, name)
                self.store.delete_key(name)
                self.applied[k] += 1
                self.store.add(f"{me}/acked", 1)

    def _apply(self, k: int, name: str) -> None:
        try:
            dropped = self.copies.apply(self._load(name, self.store.get(name)))
        except SharedFolder as e:
            log.info(f"node files copied to the head stop: {e} is written in this run directory already (a shared folder)")
            self.store.set(f"{k + 1}/shared", "1")
            self.stopped[k] = True
            return
        except (signing.SignatureError, ValueError, TypeError) as e:
            log.warning(f"a batch of node files at {name} was refused ({e}): nothing more from that node is copied")
            self.stopped[k] = True
            return
        if dropped:
            log.warning(f"{dropped} file(s) of a batch of node files had names the launcher does not ship: dropped")

    def close(self, wait_s: float = END_WAIT_S) -> bool:
        """At the job's end: apply the senders' last batches (waiting up to wait_s for them); remove the token.
        True: the head's files are its own (nothing of them is elsewhere)."""
        self.halt.set()
        self.thread.join(timeout=wait_s)
        deadline = time.monotonic() + wait_s
        try:
            with self.lock:
                while self.store is not None:
                    self.apply_posted()
                    waiting = [k for k in range(len(self.applied))
                               if not self.stopped[k] and not self.store.check([f"{k + 1}/done"])]
                    if not waiting or time.monotonic() > deadline:
                        self.apply_posted()
                        break
                    time.sleep(0.1)
                self._wait_for_byes()
        except Exception as e:
            log.warning(f"copying the other nodes' last log lines failed: {e.__class__.__name__}: {first_line(e)}")
        finally:
            try:
                os.unlink(os.path.join(self.run_dir, TOKEN_FILE))
            except OSError:
                pass
        return True


    def _wait_for_byes(self) -> None:
        """Before the head ends (and the store with it): each sender that said it is done has read its last ack.
        Bounded by BYE_WAIT_S: a sender gone meanwhile holds nobody up."""
        if self.store is None:
            return
        done = [k + 1 for k in range(len(self.applied)) if not self.stopped[k] and self.store.check([f"{k + 1}/done"])]
        deadline = time.monotonic() + BYE_WAIT_S
        while any(not self.store.check([f"{me}/{BYE}"]) for me in done) and time.monotonic() < deadline:
            time.sleep(0.05)


def start(plan: Any, host: str, port: int, key: Optional[bytes], head: bool) -> Optional[_Side]:
    """This node's side of the copying, started; None where the nodes share one folder by construction
    (a simulated job's nodes on one machine)."""
    if plan.mode not in ("static", "c10d"):
        return None
    prefix = f"launcher/{plan.rdzv_id}/mirror/"

    def connect() -> Store:
        return client(host, port, prefix)

    side = (Receiver(connect, key, prefix, plan.run_dir) if head
            else Sender(connect, key, prefix, plan.run_dir, float(plan.rdzv_timeout_s)))
    return side.start()
