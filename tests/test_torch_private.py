"""torch's private names, each used only in launcher/runtime/torch_private.py, each checked here on the installed
torch (the compatibility layer runs this file on the oldest and the newest supported torch too): a torch that renames
one fails its test here, not a user's job. Where torch_private works around a torch bug, a test shows the bug on the
installed torch, so a torch that fixes it fails that test and the workaround gets a version gate.

Also: no other module of the project names one of them, and no module assigns to an attribute of torch or submitit.
"""

import ast
import inspect
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest import mock

import pytest

from launcher.runtime import torch_private

pytestmark = [pytest.mark.compat, pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parents[1]
PRIVATE_MODULE = ROOT / "launcher" / "runtime" / "torch_private.py"
SOURCES = [p for d in ("launcher", "trainers") for p in sorted((ROOT / d).rglob("*.py"))]
OWN_PRIVATE_NAMES = {"_exit", "_getframe", "_actions", "_run_finalizers", "_run_module_as_main"}  # stdlib's, argparse's
# PContext's steps and the rendezvous classes' _record: names our own classes use too (launcher.backends.handshake);
# subclassing torch's classes is checked apart
GENERIC = {"_start", "_poll", "_close", "_record"}
TORCH_BASES = ("PContext", "ElasticAgent", "RendezvousHandler", "RendezvousBackend", "FileSystemReader", "Fsspec")


def private_names_of_torch_private():
    """Every private attribute, method and module name torch_private.py reads, overrides or imports."""
    names = set()
    for node in ast.walk(ast.parse(PRIVATE_MODULE.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            names.add(node.attr)
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("_") and not node.name.startswith("__"):
            names.add(node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("_"):
            names.add(node.value)
    return names - OWN_PRIVATE_NAMES - GENERIC


def test_no_other_module_names_a_private_name_of_torch():
    names = private_names_of_torch_private()
    assert {"_start_workers", "_num_yielded", "_state_holder", "_get_ddp_logging_data"} <= names
    found = []
    for path in SOURCES:
        if path == PRIVATE_MODULE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            imported = [a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
            for name in ([module] if module else []) + imported:
                if (name.split(".")[0] == "torch" or module and module.split(".")[0] == "torch") and \
                        any(part.startswith("_") for part in name.split(".")):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: imports {name}")
            used = node.attr if isinstance(node, ast.Attribute) else node.name if isinstance(node, ast.FunctionDef) \
                else node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
            if used in names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {used}")
            if isinstance(node, ast.ClassDef):
                for base in map(ast.unparse, node.bases):
                    if any(name in base for name in TORCH_BASES) and "torch_private" not in base:
                        for item in node.body:
                            if isinstance(item, ast.FunctionDef) and item.name in GENERIC | names:
                                found.append(f"{path.relative_to(ROOT)}:{item.lineno}: overrides {base}.{item.name}")
    assert not found, "torch's private names belong in launcher/runtime/torch_private.py:\n" + "\n".join(found)


def test_no_module_assigns_to_an_attribute_of_torch_or_submitit():
    found = []
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        theirs = set()  # local names bound to torch's or submitit's modules, classes and functions
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                theirs |= {(a.asname or a.name).split(".")[0] for a in node.names
                           if a.name.split(".")[0] in ("torch", "submitit")}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("torch", "submitit"):
                theirs |= {a.asname or a.name for a in node.names}
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("setattr", "delattr") and node.args:
                targets = [ast.Attribute(value=node.args[0], attr="?")]
            for target in targets:
                root = target
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(target, ast.Attribute) and isinstance(root, ast.Name) and root.id in theirs:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(target)}")
    assert not found, "\n".join(found)


# -- the agent ------------------------------------------------------------------------------------------------

def test_the_agents_hooks_and_state_are_there():
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.api import PContext

    for name in (*torch_private.AGENT_HOOKS, "_setup_local_watchdog", "_setup_healthcheck"):
        assert callable(getattr(LocalElasticAgent, name, None)), name
    assert {"_start", "_poll", "_close"} <= PContext.__abstractmethods__
    assert "self._pcontext" in LocalElasticAgent._shutdown.__code__.co_names or \
        "_pcontext" in LocalElasticAgent._shutdown.__code__.co_names  # the agent stops the context it holds there


def test_the_process_context_maps_torchs_steps_to_ours():
    calls = []

    class Context(torch_private.process_context_class()):
        def start_all(self):
            calls.append("start")

        def poll_all(self):
            calls.append("poll")

        def close_all(self, death_sig, timeout):
            calls.append(("close", timeout))

        def pids(self):
            return {}

    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs

    context = Context("t", print, {0: ()}, {0: {}}, DefaultLogsSpecs(log_dir=None))
    context._start(), context._poll(), context._close(None, 7)
    assert calls == ["start", "poll", ("close", 7)]


@pytest.fixture
def store():
    from launcher.agent.stores import listening_store

    return listening_store("127.0.0.1", 0, 30)


def handlers(store, run_id):
    """(ours, torch's own) c10d handlers of a one-node rendezvous on store."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    from launcher.agent.rendezvous import c10d_handler

    made = []
    for own in (True, False):
        params = RendezvousParameters("c10d", f"127.0.0.1:{store.port}", f"{run_id}-{own}", 1, 1,
                                      local_addr="127.0.0.1", is_host=False, join_timeout=20)
        state, client = create_backend(params)
        made.append((c10d_handler if own else create_handler)(client, state, params))
    return made


def test_a_node_whose_round_went_on_without_it_is_told_to_join_again_where_torchs_is_not(store):
    """Two nodes in one round (1:2); one's keep-alives stop (its agent stalled) and the other's next look drops it.
    torch's handler then tells the dropped node nothing (its workers would train on beside any job formed without
    it); ours counts a node waiting, so its agent stops its workers and joins again."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    from launcher.agent.rendezvous import c10d_handler

    told = {}
    for own in (True, False):
        pair = []
        for _ in range(2):
            params = RendezvousParameters("c10d", f"127.0.0.1:{store.port}", f"fence-{own}", 1, 2, local_addr="127.0.0.1",
                                          is_host=False, join_timeout=20, keep_alive_interval=1, keep_alive_max_attempt=3)
            state, client = create_backend(params)
            pair.append((c10d_handler if own else create_handler)(client, state, params))
        stalled, live = pair
        try:
            joins = [threading.Thread(target=h.next_rendezvous) for h in pair]
            [t.start() for t in joins], [t.join(30) for t in joins]
            assert stalled.num_nodes_waiting() == 0 and live.num_nodes_waiting() == 0  # both in the round
            stalled._stop_heartbeats()  # its agent stalls: no keep-alive from it any more
            time.sleep(5.0)  # past 3 missed keep-alives of 1 s
            assert live.num_nodes_waiting() == 0  # the live node drops it, and trains on
            told[own] = stalled.num_nodes_waiting()
        finally:
            [h.shutdown() for h in pair]
    assert told[True] == 1
    assert told[False] == 0, "torch now tells a node its round went on without it: the override can go"


def test_each_round_gets_a_fresh_workers_store_where_torchs_handler_keeps_the_first(store):
    ours, torchs = handlers(store, "rounds")
    try:
        ports = {}
        for name, handler in (("ours", ours), ("torch", torchs)):
            ports[name] = [handler.next_rendezvous().bootstrap_store_info.master_port for _ in range(2)]
        assert ports["ours"][0] != ports["ours"][1]
        assert ports["torch"][0] == ports["torch"][1], "torch now starts a store per round: gate the workaround"
        seen = torch_private.rendezvous_round(ours)
        assert seen["round"] == 1 and len(seen["nodes"]) == 1 and seen["nodes"][0].startswith("127.0.0.1:")
    finally:
        ours.shutdown(), torchs.shutdown()


def test_a_signal_inside_the_keep_alive_timers_start_leaves_a_shutdown_that_closes_the_rendezvous(store):
    """A Ctrl-C raised as the keep-alive timer starts (as one did 3 s into a launch): torch's shutdown then joins a
    thread never started and raises over the signal; ours closes the rendezvous."""
    start = threading.Thread.start

    def interrupted(thread):
        if thread.name.startswith("RendezvousKeepAliveTimer"):
            raise KeyboardInterrupt
        return start(thread)

    ours, torchs = handlers(store, "keep-alive")
    for handler in (ours, torchs):
        with mock.patch.object(threading.Thread, "start", interrupted), pytest.raises(KeyboardInterrupt):
            handler.next_rendezvous()
    assert ours.shutdown() is True and ours.is_closed()
    with pytest.raises(RuntimeError, match="cannot join thread"):
        torchs.shutdown()  # still torch's behaviour: the workaround stays


def test_rendezvous_events_that_go_nowhere_are_not_named_with_inspect_stack(store):
    """torch names each rendezvous event's caller with inspect.stack() (twice) before dropping the event; ours skips
    that while torch's events handler is the default NullHandler: it was seconds of a loaded launch's close."""
    ours, torchs = handlers(store, "events")
    calls = {"ours": 0, "torch": 0}
    stack = inspect.stack
    for name, handler in (("ours", ours), ("torch", torchs)):
        def counted(*args, name=name, **kwargs):
            calls[name] += 1
            return stack(*args, **kwargs)

        with mock.patch.object(inspect, "stack", counted):
            handler.next_rendezvous()
            assert handler.shutdown() is True
    assert torch_private.events_dropped()
    assert calls["ours"] == 0
    assert calls["torch"] > 0, "torch no longer names dropped events with inspect.stack: the override can go"


# -- a script's DataLoader and optimizer ----------------------------------------------------------------------

def test_a_dataloader_iterators_count_sampler_and_batching_are_read():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(40.0))
    loader = DataLoader(data, batch_size=4)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    iter_type, loader_type = torch_private.dataloader_types()
    assert isinstance(iterator, iter_type) and isinstance(loader, loader_type)
    assert torch_private.batches_yielded(iterator) == 3
    assert torch_private.index_sampler(iterator) is torch_private.index_sampler(loader)
    assert torch_private.index_sampler(loader).batch_size == 4 and torch_private.batches_automatically(iterator)
    assert not torch_private.batches_automatically(iter(DataLoader(data, batch_size=None)))


def test_the_optimizer_step_hooks_registered_are_listed():
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def hook(*_):
        return None

    handle = register_optimizer_step_post_hook(hook)
    try:
        assert hook in torch_private.global_optimizer_step_hooks().values()
    finally:
        handle.remove()
    assert hook not in torch_private.global_optimizer_step_hooks().values()


# -- the built-in trainer -------------------------------------------------------------------------------------

PROBE = r'''
import json, os, sys, tempfile
import torch, torch.distributed as dist
from launcher.runtime import torch_private as tp
dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
tp.ddp_sample_runtime_stats_every_step(model)
rebuilt = [tp.ddp_buckets_rebuilt(model)]
for _ in range(2):
    model(torch.randn(3, 4)).sum().backward()
rebuilt.append(tp.ddp_buckets_rebuilt(model))
stats = tp.ddp_runtime_stats(model.logger)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor
shard = tp.dtensor_shard(distribute_tensor(torch.ones(4), init_device_mesh("cpu", (1,))))
counters = tp.dynamo_counters()
import torch.distributed.checkpoint as dcp
reader_class, writer_class = tp.fsspec_checkpoint_classes()
where = tempfile.mkdtemp()
dcp.save({"w": torch.ones(2), "nested": {"lr": 0.5}}, storage_writer=writer_class(where), no_dist=True)
reader = reader_class(where)
metadata_path = str(tp.checkpoint_metadata_path(reader, None))
state = {"nested": {"lr": 0.0}}
tp.checkpoint_set_element()(state, ("nested", "lr"), 0.5)
layout_name, layout = tp.serialization_layout_global()
print(json.dumps({"rebuilt": rebuilt, "stat_keys": sorted(stats), "shard": type(shard).__name__,
                  "shard_sum": float(shard.sum()), "counters": "stats" in counters or counters["stats"] == {},
                  "metadata": os.path.basename(metadata_path), "set": state["nested"]["lr"],
                  "layout": [layout_name, callable(layout), layout.__name__],
                  "storage_info": tp.checkpoint_storage_info_class().__name__}))
dist.destroy_process_group()
'''


def test_the_trainers_private_names_read_what_they_say_on_this_torch(tmp_path):
    found = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=100, cwd=tmp_path)
    assert found.returncode == 0, found.stderr[-3000:]
    seen = json.loads(found.stdout.strip().splitlines()[-1])
    assert seen["rebuilt"] == [False, True]
    assert {"backward_comm_time", "backward_compute_time", "iteration"} <= set(seen["stat_keys"])
    assert seen["shard"] == "Tensor" and seen["shard_sum"] == 4.0
    assert seen["counters"] and seen["metadata"] == ".metadata" and seen["set"] == 0.5
    assert seen["layout"] == [["torch.serialization", "_get_layout"], True, "_get_layout"]
    assert seen["storage_info"] == "_StorageInfo"


def test_the_trainer_zygotes_preloads_exist():
    import importlib.util

    for name in torch_private.TRAINER_PRELOAD:
        assert importlib.util.find_spec(name) is not None, name
