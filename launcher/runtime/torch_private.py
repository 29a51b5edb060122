"""Every private name of torch the project uses, in one place (submitit's: launcher.backends.slurm.submitit_private).

Each use is one small function or class factory here, with the torch versions it is known on (2.10 to 2.15, the
compatibility layer: tests/test_torch_private.py checks each on every one) and what would replace it: an upstream
issue, or the public API once torch has one. Nothing here assigns to an attribute of a torch module or class: the
agent's hooks are overrides in our own subclasses, built by the functions below.

Importing this module imports no torch (each function imports what it reads, when called), so the launcher, its
agent, the trainers and a worker's stdlib-only namespace (launcher.worker.bootstrap executes this file there) all
read torch's internals through it.
"""

import sys
from typing import Any, Dict, Optional, Tuple

# -- the elastic agent (torch.distributed.elastic.agent.server): built by launcher.agent.elastic ------------------
# LocalElasticAgent's template hooks. torch documents no public way to start an agent's workers other than its own
# multiprocessing contexts, or to see a round's rendezvous; these are the hooks torch's own agent tests override.
AGENT_HOOKS = ("_start_workers", "_rendezvous", "_monitor_workers", "_restart_workers")


def elastic_agent_class(hooks: Any) -> type:
    """A LocalElasticAgent whose template hooks call `hooks`:

    - ``hooks.start_workers(agent, worker_group) -> process context`` starts an attempt's workers (torch would start
      its own multiprocessing context); the agent then watches and stops the context it returned, as its own;
    - ``hooks.after_rendezvous(worker_group)`` after each round, ``hooks.monitored(worker_group, result)`` after each
      look at the workers, ``hooks.restarting(worker_group)`` before each restart (a failure's or a new node's).
    """
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    class LauncherElasticAgent(LocalElasticAgent):
        def _start_workers(self, worker_group):
            self._pcontext = hooks.start_workers(self, worker_group)
            return self._pcontext.pids()

        def _rendezvous(self, worker_group):
            super()._rendezvous(worker_group)
            hooks.after_rendezvous(worker_group)

        def _monitor_workers(self, worker_group):
            result = super()._monitor_workers(worker_group)
            hooks.monitored(worker_group, result)
            return result

        def _restart_workers(self, worker_group):
            hooks.restarting(worker_group)
            return super()._restart_workers(worker_group)

    return LauncherElasticAgent


def start_worker_services(agent: Any, envs: Dict[int, Dict[str, str]]) -> None:
    """What torch's _start_workers sets up beside the processes: the file-timer watchdog
    (TORCHELASTIC_ENABLE_FILE_TIMER) and the health-check server (TORCHELASTIC_HEALTH_CHECK_PORT), each off unless
    its variable is set."""
    agent._setup_local_watchdog(envs=envs)
    agent._setup_healthcheck()


def process_context_class() -> type:
    """torch's PContext (torch.distributed.elastic.multiprocessing.api), the contract of a set of worker processes the
    agent watches, with its abstract steps given public names: a subclass defines ``start_all()``, ``poll_all()``
    (a RunProcsResult once every process ended, else None) and ``close_all(death_sig, timeout)``."""
    from torch.distributed.elastic.multiprocessing.api import PContext

    class ProcessContext(PContext):
        def _start(self) -> None:
            self.start_all()

        def _poll(self) -> Any:
            return self.poll_all()

        def _close(self, death_sig: Any, timeout: int = 30) -> None:
            self.close_all(death_sig, timeout)

        def start_all(self) -> None:
            raise NotImplementedError

        def poll_all(self) -> Any:
            raise NotImplementedError

        def close_all(self, death_sig: Any, timeout: int) -> None:
            raise NotImplementedError

    return ProcessContext


# -- the c10d rendezvous (torch.distributed.elastic.rendezvous.dynamic_rendezvous) ---------------------------------
def rendezvous_handler_class(create_store_server: Any, dropped: Any) -> type:
    """A DynamicRendezvousHandler whose rounds each start a fresh workers' store, from create_store_server(addr,
    port) (one that listens on this node's address alone). torch keeps the first round's store for good, so
    restarted workers read the dead attempt's gloo addresses and hang (pytorch#135712, open as of torch 2.15).

    Its shutdown also ends cleanly where a signal interrupted the keep-alive timer's start: torch's cancel then joins
    a thread never started ("cannot join thread before it is started", over the signal); the timer's finalizer has
    run by then, so a second shutdown closes the rendezvous.

    It fences a node its round went on without: torch's agent asks num_nodes_waiting() at each look at its healthy
    workers, and a node whose keep-alives lapsed (its agent stalled) is no longer a participant of the round it runs
    in; torch would leave its workers training beside whatever job the nodes outside that round form. Ours counts
    one node waiting then, so the agent stops its workers and joins again, as for a node joining
    (dropped(addr) is called once, to say so); the job's other ranks fail on the stopped peer and re-form with it.

    Its events (its own and its operation executor's) skip naming their caller while torch records none: torch's
    _record calls inspect.stack() twice for that name before construct_and_record_rdzv_event returns at once on its
    "dynamic_rendezvous" NullHandler (the default), 0.3 CPU-s of each launch's rendezvous and close, seconds under
    load (torch 2.10 to 2.15). With a handler there, torch's own _record runs (its events then name "_record")."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    class OpExecutor(dynamic_rendezvous._DistributedRendezvousOpExecutor):
        def _record(self, *args, **kwargs):
            if not events_dropped():
                super()._record(*args, **kwargs)

    class LauncherRendezvousHandler(dynamic_rendezvous.DynamicRendezvousHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._op_executor = OpExecutor(self._this_node, self._state_holder, self._settings)
            self._launcher_round = None

        def _record(self, *args, **kwargs):
            if not events_dropped():
                super()._record(*args, **kwargs)

        def _create_tcp_store_server(self, master_addr, master_port):
            return create_store_server(master_addr, master_port)

        def next_rendezvous(self):
            self._shared_tcp_store_server = None  # so rank 0 of the round starts a new one
            self._bootstrap_store_info = None
            self._launcher_round = None
            info = super().next_rendezvous()
            self._launcher_round = self._state_holder.state.round  # the round this node's workers run in
            return info

        def num_nodes_waiting(self):
            waiting = super().num_nodes_waiting()  # (its state synced)
            if waiting or self._launcher_round is None:
                return waiting
            state = self._state_holder.state
            if state.round == self._launcher_round and self._this_node in state.participants:
                return 0
            self._launcher_round = None  # said once: the agent restarts its workers now, and joins again
            dropped(self._this_node.addr)
            return 1


        def shutdown(self) -> bool:
            try:
                return super().shutdown()
            except RuntimeError:
                return super().shutdown()

        def launcher_spares_waiting(self) -> int:
            """Nodes kept beyond MAX (torch's redundancy list: hot spares), the state synced first."""
            with self._heartbeat_lock:
                self._state_holder.sync()
                return len(getattr(self._state_holder.state, "redundancy_list", ()))

        def launcher_leave(self) -> None:
            """This node out of the round without closing it (shutdown would end the job for every node): what the
            others' keep-alive sweep would do once its keep-alives lapsed, now."""
            self._stop_heartbeats()
            self._launcher_round = None
            deadline = self._get_deadline(self._settings.timeout.close)
            self._op_executor.run(dynamic_rendezvous._RendezvousExitOp(), deadline)

    return LauncherRendezvousHandler


def spares_waiting(handler: Any) -> int:
    """The hot spares waiting in a c10d round (0 for a handler that keeps none: static)."""
    ask = getattr(handler, "launcher_spares_waiting", None)
    return int(ask()) if ask is not None else 0


def leave_rendezvous(handler: Any) -> None:
    """Take this node out of its c10d round, the round left open for the others (no-op on static)."""
    leave = getattr(handler, "launcher_leave", None)
    if leave is not None:
        leave()


def events_dropped() -> bool:
    """torch's own test (construct_and_record_rdzv_event) of whether a rendezvous event goes anywhere."""
    import logging

    from torch.distributed.elastic.events import get_logging_handler

    return isinstance(get_logging_handler("dynamic_rendezvous"), logging.NullHandler)


def rendezvous_round(handler: Any) -> Optional[Dict[Any, Any]]:
    """{round, nodes: ["host:pid", ...]} of the round a c10d handler last completed; None for a handler that keeps no
    such state (static). torch's handler shows neither (its RendezvousInfo gives this node's rank and the count)."""
    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    participants = getattr(state, "participants", None)
    if state is None or not isinstance(participants, dict):
        return None
    return {"round": int(getattr(state, "round", 0)), "nodes": sorted(f"{d.addr}:{d.pid}" for d in participants)}


def names_this_machine(host: str) -> bool:
    """torch's test of whether a rendezvous endpoint's host is this machine (by its host names and their addresses),
    as its c10d backend decides whether to host the store: the launcher asks it the same way."""
    from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname

    return bool(_matches_machine_hostname(host))


# -- a script's DataLoader and optimizer, seen from a worker (launcher/worker/loaders.py, launcher.runtime.log) -----
# A DataLoader iterator's count of batches it yielded, its batch sampler, and whether it batches (torch 1.x to 2.15).
# torch has no public "batches so far" on an iterator (pytorch#96425 asks for a stateful loader's position).
def dataloader_types() -> Tuple[Any, ...]:
    """(the DataLoader iterators' base class, DataLoader), or (None, None) before torch.utils.data is imported."""
    module = sys.modules.get("torch.utils.data.dataloader")
    return getattr(module, "_BaseDataLoaderIter", None), getattr(module, "DataLoader", None)


def batches_yielded(iterator: Any) -> int:
    return iterator._num_yielded


def index_sampler(loader_or_iterator: Any) -> Any:
    """The sampler of indices (a BatchSampler where the loader batches) a DataLoader or its iterator draws from."""
    return loader_or_iterator._index_sampler


def batches_automatically(iterator: Any) -> bool:
    return bool(getattr(iterator, "_auto_collation", False))


def global_optimizer_step_hooks() -> Optional[Dict[Any, Any]]:
    """The hooks register_optimizer_step_post_hook added (torch.optim.optimizer's registry), None before torch.optim
    is imported: torch offers adding one, not listing them."""
    return getattr(sys.modules.get("torch.optim.optimizer"), "_global_optimizer_post_hooks", None)


# -- the built-in trainer (launcher.trainers) --------------------------------------------------------------------
# Modules whose import the trainer zygote takes on before it forks: DDP's constructor imports torch._dynamo (seconds
# per worker otherwise).
TRAINER_PRELOAD = ("torch._dynamo", "torch.nn.parallel")


def ddp_sample_runtime_stats_every_step(model: Any) -> None:
    """Have DDP record its runtime statistics at every iteration (by default it samples some)."""
    model._set_ddp_runtime_logging_sample_rate(1)


def ddp_runtime_stats(ddp_logger: Any) -> Dict[str, Any]:
    """DDP's own runtime statistics, from its logger (``model.logger``): the ints of forward and backward compute and
    communication times (ns) and the iteration they are of. torch exposes them only through this name
    (pytorch#71303 asks for a public per-rank timing API)."""
    return dict(ddp_logger._get_ddp_logging_data().ints_map)


def dtensor_shard(tensor: Any) -> Any:
    """A DTensor's own local shard, without autograd (DTensor.to_local() is differentiable: not inside a saved-tensor
    hook); any other tensor itself."""
    return getattr(tensor, "_local_tensor", tensor)


def ddp_buckets_rebuilt(model: Any) -> bool:
    """Whether DDP has rebuilt its gradient buckets (after its first backward): until then its step costs differ."""
    return bool(getattr(model, "_has_rebuilt_buckets", True))


def dynamo_counters() -> Any:
    """torch._dynamo's counters (graph breaks, recompiles): torch.compiler has no public reader of them."""
    from torch._dynamo.utils import counters

    return counters


def fsspec_checkpoint_classes() -> Tuple[Any, ...]:
    """(FsspecReader, FsspecWriter): torch.distributed.checkpoint's fsspec storage, not re-exported (torch 2.10-2.15)."""
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    return FsspecReader, FsspecWriter


def checkpoint_set_element() -> Any:
    """torch.distributed.checkpoint's setter of one element of a nested state dict by its path."""
    from torch.distributed.checkpoint._traverse import set_element

    return set_element


def checkpoint_metadata_path(reader: Any, rank: Optional[int]) -> Any:
    """A FileSystemReader's path of the metadata file for rank (torch 2.13+ keeps one per rank where asked)."""
    return reader._get_metadata_path(rank)


def checkpoint_storage_info_class() -> type:
    """The class DCP's .metadata pickles per stored item (torch.distributed.checkpoint.filesystem._StorageInfo): its
    weights-only reader must allow it by name."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    return _StorageInfo


def serialization_layout_global() -> Tuple[Any, ...]:
    """The (module, name) and function torch.load's weights_only unpickler must allow for a DCP checkpoint's
    tensor layout (torch.serialization._get_layout; torch.serialization.add_safe_globals takes it as is)."""
    import torch.serialization

    return ("torch.serialization", "_get_layout"), torch.serialization._get_layout
