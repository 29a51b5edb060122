"""Every TCPStore server of a job listens on one address: loopback on one machine, the address that
reaches the other nodes across machines; never on all interfaces.

torch's TCPStore server listens on every interface whatever host it is given, and anyone who can
reach its port reads and writes the job's keys (torch's dynamic rendezvous unpickles the state it
reads there, which launcher.agent.signed_rdzv therefore signs). A socket bound here first and handed
over with ``master_listen_fd`` keeps the server on the address asked for. The servers are
multi-tenant: torch's rendezvous code asking this process for a server on the same port gets this
one instead of starting its own.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any, Optional, Tuple

LISTEN_BACKLOG = 2048  # TCPStore's own backlog is large: every worker of a big job connects at once


def bound_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host's address (the first getaddrinfo gives) and port (0: any free one).

    Raises OSError when the address is not this machine's (EADDRNOTAVAIL) or the port is taken.
    """
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore does: TIME_WAIT is no conflict
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def listening_store(host: str, port: int, timeout_s: Optional[float] = None) -> Any:
    """A multi-tenant TCPStore server (and client) listening on host's address only.

    Raises OSError (address not this machine's, port taken) or RuntimeError (from c10d).
    """
    # torch is imported here, not at the top: a SLURM submission or a dry run loads this module
    # through launcher.backends and never starts a store; `import torch` costs seconds.
    from torch.distributed import TCPStore

    sock = bound_socket(host, port)
    address, bound_port = sock.getsockname()[:2]
    fd = sock.detach()  # the store owns the socket from here on
    timeout = datetime.timedelta(seconds=timeout_s) if timeout_s else datetime.timedelta(seconds=300)
    try:
        return TCPStore(address, bound_port, is_master=True, multi_tenant=True, wait_for_workers=False,
                        timeout=timeout, master_listen_fd=fd)
    except BaseException:
        close_if_still_listening(fd, (address, bound_port))
        raise


def close_if_still_listening(fd: int, address: Tuple[str, int]) -> None:
    """Close fd if it is still the socket bound to address: a TCPStore that failed part way (a signal in
    its client's connect) has closed it already, and the number may name another file by now."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        ours = tuple(sock.getsockname()[:2]) == address
    except OSError:
        ours = False
    if ours:
        sock.close()
    else:
        sock.detach()
