"""A distributed training launcher for PyTorch: one command from laptop to cluster."""

__all__ = ["heartbeat"]


def __getattr__(name: str) -> object:
    """``heartbeat`` is loaded on first use: `python -m launcher` runs this file before launcher.__main__,
    and nothing may load ahead of the interrupt hold there (launcher.interrupts)."""
    if name == "heartbeat":
        from launcher.runtime.beats import heartbeat

        return heartbeat
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
