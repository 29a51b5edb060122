"""A distributed training launcher for PyTorch: one command from laptop to cluster."""

__all__ = ["heartbeat", "log", "launch", "submit", "Job", "LaunchFailed"]

# The Python API (docs/python-api.md), "module:attribute" as in launcher.backends.registry: imported by name on
# first use, so this package's top imports none of it (launcher.api reaches most of the launcher).
API = {
    "launch": "launcher.api.submit:launch",
    "submit": "launcher.api.submit:submit",
    "Job": "launcher.api.job:Job",
    "LaunchFailed": "launcher.errors:LaunchFailed",
}


def __getattr__(name: str) -> object:
    """``heartbeat``, ``log`` and the Python API (API above) are loaded on first use: `python -m launcher` runs this
    file before launcher.__main__, and nothing may load ahead of the interrupt hold there (launcher.interrupts);
    a script that imports launcher under torchrun gets nothing else either."""
    if name == "heartbeat":
        from launcher.runtime.beats import heartbeat

        return heartbeat
    if name == "log":
        from launcher.runtime.log import log

        return log
    if name in API:
        import importlib

        module, _, attribute = API[name].partition(":")
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")


def _warm_in_a_kernel() -> None:
    """In a Jupyter kernel (or IPython): the first launch()'s launcher is started now, torch imported by the time a
    cell calls it (launcher.api.standby; LAUNCHER_STANDBY=0: none). Nowhere else: a script, a worker, the CLI."""
    import os
    import sys

    shell = getattr(sys.modules.get("IPython"), "get_ipython", None)  # imported alone (tqdm.auto, a library): no shell
    if shell is not None and shell() is not None and "TORCHELASTIC_RUN_ID" not in os.environ:  # a rank's: never
        from launcher.api import standby

        standby.prepare()


_warm_in_a_kernel()
