"""A distributed training launcher for PyTorch: one command from laptop to cluster."""

__all__ = ["heartbeat", "log"]


def __getattr__(name: str) -> object:
    """``heartbeat`` and ``log`` are loaded on first use: `python -m launcher` runs this file before launcher.__main__,
    and nothing may load ahead of the interrupt hold there (launcher.interrupts); a script that imports launcher
    under torchrun gets nothing else either."""
    if name == "heartbeat":
        from launcher.runtime.beats import heartbeat

        return heartbeat
    if name == "log":
        from launcher.runtime.log import log

        return log
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
