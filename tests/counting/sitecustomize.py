"""Counts, in a real launch, the calls of the launcher's config resolution and plan building, its exec and its
torch import (tests/test_prestart.py).

On PYTHONPATH with LAUNCHER_TEST_CALLS=FILE, every process of the launch imports this at its interpreter's start
(the launcher, the process its exec makes, its zygote and workers) and appends to FILE one line per event:
"PID MODULE.FUNCTION" for each call of a function in COUNTED (wrapped as its module finishes loading, so every
caller, through any import, reaches the wrapper), "PID exec" where an interpreter starts as the bootstrap a launch
execs into (launcher.prestart), "PID import torch" where torch is first imported. Nothing else changes: the
functions run as they would. (A process keeps its PID across exec: one launcher's lines share one PID.)
With LAUNCHER_TEST_MARK_TORCH=1 the torch import is also marked on the process's stderr ("[counting] import
torch"), so a reader of that stream sees which of the process's own lines came before it.
"""

import functools
import importlib.abc
import importlib.machinery
import os
import sys

COUNTED = {"launcher.config.schema": ("load_config", "from_dict"), "launcher.plan": ("build_plan",)}
OUT = os.environ.get("LAUNCHER_TEST_CALLS")


def _note(event):
    with open(OUT, "a") as f:
        f.write(f"{os.getpid()} {event}\n")


def _counting(module_name, function):
    @functools.wraps(function)
    def counted(*args, **kwargs):
        _note(f"{module_name}.{function.__name__}")
        return function(*args, **kwargs)
    return counted


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, names):
        self.loader, self.names = loader, names

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        for name in self.names:
            setattr(module, name, _counting(module.__name__, getattr(module, name)))


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch":
            _note("import torch")
            if os.environ.get("LAUNCHER_TEST_MARK_TORCH"):
                os.write(2, b"[counting] import torch\n")
        if name not in COUNTED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                spec.loader = _Loader(spec.loader, COUNTED[name])
                return spec
        return None


if OUT:
    sys.meta_path.insert(0, _Finder())
    if "--handover" in sys.orig_argv[3:5] and sys.orig_argv[2].endswith("bootstrap.py"):  # `python -u BOOTSTRAP KIND`
        _note("exec")
