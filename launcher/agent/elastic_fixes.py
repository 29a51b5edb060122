"""Workarounds for torch's elastic agent (torch 2.13), each measured, each in one place.

- The c10d rendezvous names the calling method of every event it records with
  ``inspect.stack()``, twice per event. That reads the source file of every frame on the stack:
  about 0.3 s of CPU per rendezvous here, all of it holding the GIL while the agent preloads
  the workers' imports (launcher.agent.launch.Preload). ``sys._getframe`` gives the same name without
  reading any source.
- The c10d rendezvous shares one TCPStore server with the workers (torchrun's
  TORCHELASTIC_USE_AGENT_STORE=True) and starts it on every interface, once per agent: restarted
  workers then read the dead attempt's gloo addresses and hang (FACTS.md, pytorch#135712). Here
  each rendezvous round starts its own server, on this node's address only (launcher.agent.stores).
  A torch without these hooks gets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 instead: rank 0 of the
  workers then hosts their store (on every interface, which torch decides there).
- The static rendezvous (--nodes N on one machine, SLURM, Ray, --master-addr) keeps one store, at
  --master-port, for the agents and the workers of every attempt: restarted workers read the dead
  attempt's gloo addresses there and fail ("Gloo connectFullMesh failed ... Connection refused": 2 of
  3 `--nodes 2 --max-restarts 1` restarts here). Each restart's workers get a store of their own
  instead, started by node 0's agent, its port passed to the other agents through the agents' store.
- The c10d rendezvous sleeps a random 0-0.3 s before its first round, to skew several nodes' first
  attempts apart. A job of one node has nothing to skew: there it only delays the first step (by
  0.15 s on average, 4% of a plain script's start here), so single-node jobs skip it.
- The c10d rendezvous's keep-alive timer (``_PeriodicTimer``) registers the finalizer that joins its
  thread before it starts the thread. A Ctrl-C raised in between (torch's SignalException, in the main
  thread, as the agent's rendezvous starts) left a thread never started; the shutdown's ``cancel()``
  then joined it: "RuntimeError: cannot join thread before it is started" replaced the signal, and
  the launcher ended in exit 1 and a traceback instead of 130 (2 of 50 launches Ctrl-C'd 3.1-3.3 s
  in, bench/early_interrupt.py --max-delay 4). The join now passes over a thread that never started.
- ``LaunchConfig(shutdown_timeout=...)`` is new in torch 2.13; the CUDA builds users install
  (2.11 on the H100 this was run on) reject it, so fields the installed torch lacks are dropped
  (the agent then waits its own default before SIGKILL).
"""

from __future__ import annotations

import dataclasses
import datetime
import sys
from typing import Any, Dict

from launcher.agent.stores import listening_store

# The fallback where torch lacks the hooks patched below: a store per attempt, hosted by rank 0.
NO_SHARED_STORE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def method_name(depth: int = 2) -> str:
    """What ``inspect.stack()[depth].function`` returns (frame 0 is this function), without the source."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # the stack is not that deep
        return "no_method_name"


def apply(nodes: int = 2) -> Dict[str, str]:
    """Patch torch's c10d rendezvous for a job of this many nodes; returns what the agent's environment
    needs besides (see above)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    _timer_stops_unstarted_threads()
    if callable(getattr(dynamic_rendezvous, "get_method_name", None)):
        dynamic_rendezvous.get_method_name = method_name
    if callable(getattr(dynamic_rendezvous, "_delay", None)):
        torch_delay = getattr(dynamic_rendezvous._delay, "torch_delay", dynamic_rendezvous._delay)
        dynamic_rendezvous._delay = torch_delay if nodes > 1 else _without_jitter(torch_delay)
    return {} if _store_per_round(dynamic_rendezvous.DynamicRendezvousHandler) else dict(NO_SHARED_STORE_ENV)


def _timer_stops_unstarted_threads() -> None:
    """torch's keep-alive timer's stop, for a thread a signal kept from starting too (see above)."""
    from torch.distributed.elastic.rendezvous import utils

    timer = getattr(utils, "_PeriodicTimer", None)
    if timer is not None and callable(getattr(timer, "_stop_thread", None)):
        if "_launcher_torch_stop_thread" not in vars(timer):  # torch's own, kept (tests/test_plan.py)
            timer._launcher_torch_stop_thread = vars(timer)["_stop_thread"]
        timer._stop_thread = staticmethod(stop_timer_thread)


def stop_timer_thread(thread: Any, stop_event: Any) -> None:
    """What torch's ``_PeriodicTimer._stop_thread`` does: set the stop event and join the thread; one whose
    start a signal interrupted either never runs or ends at once on the event, with nothing to join."""
    stop_event.set()
    try:
        thread.join()
    except RuntimeError:  # "cannot join thread before it is started"
        pass


def _without_jitter(torch_delay: Any) -> Any:
    """torch's rendezvous ``_delay`` less its random delays (given as a (low, high) range); fixed ones stay."""
    def delay(seconds: Any) -> None:
        if not isinstance(seconds, tuple):
            torch_delay(seconds)

    delay.torch_delay = torch_delay  # type: ignore[attr-defined]
    return delay


def _store_per_round(handler_class: Any) -> bool:
    """Each round (each attempt) gets a fresh workers' store, listening on this node's address alone."""
    if getattr(handler_class, "_launcher_store_per_round", False):
        return True
    hooks = ("_create_tcp_store_server", "next_rendezvous")
    if not all(callable(getattr(handler_class, h, None)) for h in hooks):
        return False
    torch_next_rendezvous = handler_class.next_rendezvous

    def create_tcp_store_server(self: Any, master_addr: str, master_port: int) -> Any:
        # master_addr is this node's address (LaunchConfig.local_addr); the workers connect to it
        return listening_store(master_addr, master_port)

    def next_rendezvous(self: Any) -> Any:
        # torch keeps the first round's server for good; forgetting it makes rank 0 start a new one
        self._shared_tcp_store_server = None
        self._bootstrap_store_info = None
        return torch_next_rendezvous(self)

    handler_class._create_tcp_store_server = create_tcp_store_server
    handler_class.next_rendezvous = next_rendezvous
    handler_class._launcher_store_per_round = True
    return True


RESTART_STORE_KEY = "launcher/workers-store/restart-{}"


def restart_workers_store(worker_group: Any, restart: int, timeout_s: float) -> Any:
    """A restart of a static rendezvous: point its workers at a store of their own (see above).

    Node 0's agent starts it on the workers' master address and returns it (keep it while they run);
    the other agents read its port from the agents' store, waiting up to timeout_s, and return None.
    """
    key = RESTART_STORE_KEY.format(restart)
    store = None
    if worker_group.group_rank == 0:
        store = listening_store(worker_group.master_addr, 0, timeout_s)
        worker_group.store.set(key, str(store.port))
        port = store.port
    else:
        worker_group.store.wait([key], datetime.timedelta(seconds=timeout_s))
        text = worker_group.store.get(key).decode("ascii", "replace")
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise RuntimeError(f"the workers' store port for restart {restart} read back as {text[:40]!r}")
        port = int(text)
    worker_group.master_port = port
    return store


def launch_config(config_class: Any, **fields: Any) -> Any:
    """``config_class(**fields)`` without the fields this torch's LaunchConfig does not have."""
    known = {f.name for f in dataclasses.fields(config_class)}
    return config_class(**{k: v for k, v in fields.items() if k in known})
