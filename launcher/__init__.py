"""A distributed training launcher for PyTorch: one command from laptop to cluster."""

from launcher.runtime.beats import heartbeat

__all__ = ["heartbeat"]
