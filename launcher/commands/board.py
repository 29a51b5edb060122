"""The `board` command: a local web page of every run under an output directory, live.

    python -m launcher board [output_dir] [--port P] [--host 127.0.0.1] [--no-token]

Served on loopback by default and only to requests carrying the token of the URL it prints (else any
user of the machine could read the runs); nothing is fetched from the network (plotly.js comes from
the installed plotly package). Its web dependencies are the optional `board` extra, imported only
here, so the rest of the launcher runs without them.
"""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path
from typing import List

from launcher.errors import ConfigError
from launcher.usage import OneLineParser

DEFAULT_OUTPUT_DIR = "launcher_runs"  # the config's output_dir default (launcher.config.schema)
DEFAULT_PORT = 8765


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="python -m launcher board",
                      description="Serve a live web board of the runs under OUTPUT_DIR (read-only).")
    p.add_argument("output_dir", nargs="?", default=DEFAULT_OUTPUT_DIR,
                   help=f"the runs' output directory (default {DEFAULT_OUTPUT_DIR})")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to serve on (default {DEFAULT_PORT}; 0 = any free)")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1, this machine only)")
    p.add_argument("--expose", action="store_true",
                   help="allow a --host other machines can reach: plain HTTP, anyone who sees the token sees your runs")
    p.add_argument("--no-token", action="store_true",
                   help="answer requests without the board's token: any user of this machine can read the runs")
    return p


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: List[str]) -> int:
    args = build_parser().parse_args(argv)
    root = Path(args.output_dir).expanduser()
    if not root.is_dir():
        raise ConfigError(f"output_dir {root} is not a directory: pass the folder your runs are in, "
                          f"e.g. `python -m launcher board {DEFAULT_OUTPUT_DIR}`")
    if not is_loopback(args.host) and not args.expose:
        raise ConfigError(f"--host {args.host} serves your runs to other machines over plain HTTP: "
                          "add --expose if that is what you want, or leave --host out (127.0.0.1)")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: pick a port from 1 to 65535 (0 = any free one)")
    try:
        from launcher.board.auth import new_token
        from launcher.board.server import bind, serve
    except ImportError as e:
        print(f"error: the board needs {e.name or 'its web dependencies'}: pip install -e .[board]", file=sys.stderr)
        return 2
    host = "127.0.0.1" if args.host == "localhost" else args.host
    try:
        sock = bind(host, args.port)
    except OSError as e:
        raise ConfigError(f"cannot serve on {args.host}:{args.port} ({e.strerror or e}): "
                          "pick another with --port P (0 = any free one)") from e
    serve(root.resolve(), host, sock, None if args.no_token else new_token())
    return 0
