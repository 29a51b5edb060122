"""Which address, port and interface a node uses: names that resolve, ports that are free, the
interface that reaches the other nodes. With launcher.backends.handshake, the one place that opens
the launcher's own sockets.
"""

from __future__ import annotations

import logging
import os
import random
import socket
from typing import Optional, Tuple

from launcher.config.rdzv_secret import read_rdzv_secret
from launcher.errors import ConfigError
from launcher.runtime import torch_private

log = logging.getLogger("launcher")


def resolve_or_fail(host: str, flag: str) -> None:
    """A host name that does not resolve is a one-line error before anything starts."""
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise ConfigError(f"{flag} {host} does not resolve ({e.args[-1] if e.args else e}): "
                          "check the spelling, or give node 0's IP address") from e


EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
BELOW_EPHEMERAL = 12000  # how many ports under the ephemeral range to draw from


def free_port(host: str = "127.0.0.1") -> int:
    """A free port for nodes simulated on this machine to meet on, drawn below the kernel's ephemeral range.

    A port from bind(0) is one the kernel also hands to outgoing connections: in the seconds before node 0
    binds it (its import of torch), another job's gloo connection took it once ("already in use", a loaded
    test suite). Below the range only a listener can hold it, and the draw is random, not sequential."""
    low = ephemeral_low()
    draw = random.SystemRandom()
    for _ in range(64) if low - BELOW_EPHEMERAL >= 1024 else ():
        port = draw.randrange(low - BELOW_EPHEMERAL, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a machine whose range starts low
        s.bind((host, 0))
        return int(s.getsockname()[1])


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default, 32768, where it cannot be read)."""
    try:
        with open(EPHEMERAL_RANGE_FILE, encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore does: TIME_WAIT is no conflict
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def interface_towards(host: str, port: int) -> Optional[Tuple[str, str]]:
    """(interface name, local address) this machine would use to reach host, or None if unknown.

    gloo otherwise binds to whatever the machine's host name resolves to, often 127.0.1.1 on
    Debian, and other machines then cannot reach it. A UDP connect sends nothing.
    """
    import psutil

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            local = s.getsockname()[0]
    except OSError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local for a in addrs):
            return name, local
    return None


def choose_interface(host: str, port: int) -> Optional[str]:
    """Workers talk over the interface that reaches host (loopback for a job on this machine alone),
    unless the user chose one; returns this machine's address on it (None: unknown)."""
    found = interface_towards(host, port)
    if found is None:
        return None
    name, address = found
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = name
        os.environ.setdefault("NCCL_SOCKET_IFNAME", name)
        say = log.debug if address.startswith("127.") else log.info  # loopback: nothing to tell
        say(f"workers talk over interface {name} ({address}); set GLOO_SOCKET_IFNAME to choose another")
    return address


def check_before_start(mode: str, endpoint: str, node_rank: Optional[int], secret_file: Optional[str]) -> None:
    """What can fail before anything starts, checked before torch loads: an address that does not resolve, node 0's
    port taken, a rendezvous secret file that gives no secret (read again when the node meets the others)."""
    if mode not in ("static", "c10d"):
        return
    host, _, port = endpoint.rpartition(":")
    resolve_or_fail(host.strip("[]"), "--master-addr" if mode == "static" else "--rdzv-endpoint")
    if mode == "static" and (node_rank or 0) == 0:
        require_free_port(int(port))
    read_rdzv_secret(secret_file, os.environ, warn=True)


def require_free_port(port: int) -> None:
    """Node 0 hosts the rendezvous: a port something else holds is a usage error, named before it starts."""
    if not port_is_free(port):
        raise ConfigError(f"port {port} is already in use on this machine (node 0): pick another --master-port "
                          f"for every node, or stop what holds it (`ss -ltnp 'sport = :{port}'`)")


def is_local(host: str) -> bool:
    """Whether host is this machine. torch's test compares it with the host name's addresses only, and misses
    an address on another interface (a second NIC, or a network namespace whose host name resolves to loopback):
    such a node never hosted the c10d rendezvous and waited for itself; an address we can bind to is ours."""
    return torch_private.names_this_machine(host) or _can_bind(host)


def _can_bind(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, _, _, _, address in infos:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(address)
                return True
            except OSError:
                continue
    return False
