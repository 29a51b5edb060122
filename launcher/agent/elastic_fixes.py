"""Workarounds for torch's elastic agent (torch 2.13), each measured, each in one place.

- The c10d rendezvous names the calling method of every event it records with
  ``inspect.stack()``, twice per event. That reads the source file of every frame on the stack:
  about 0.3 s of CPU per rendezvous here, all of it holding the GIL while the agent preloads
  the workers' imports (launcher.agent.launch.Preload). ``sys._getframe`` gives the same name without
  reading any source.
- Restarted workers reusing the agent's TCPStore read the dead attempt's gloo addresses: see
  ``AGENT_ENV`` in launcher.plan (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1).
- ``LaunchConfig(shutdown_timeout=...)`` is new in torch 2.13; the CUDA builds users install
  (2.11 on the H100 this was run on) reject it, so fields the installed torch lacks are dropped
  (the agent then waits its own default before SIGKILL).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any


def method_name(depth: int = 2) -> str:
    """What ``inspect.stack()[depth].function`` returns (frame 0 is this function), without the source."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # the stack is not that deep
        return "no_method_name"


def apply() -> None:
    """Patch the rendezvous module's event naming; a torch without it is left alone."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    if callable(getattr(dynamic_rendezvous, "get_method_name", None)):
        dynamic_rendezvous.get_method_name = method_name


def launch_config(config_class: Any, **fields: Any) -> Any:
    """``config_class(**fields)`` without the fields this torch's LaunchConfig does not have."""
    known = {f.name for f in dataclasses.fields(config_class)}
    return config_class(**{k: v for k, v in fields.items() if k in known})
