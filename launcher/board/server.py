"""The board's web app (Flask): one page shell, JSON APIs the page polls, and plotly.js from the plotly package.

Read-only and GET-only: every path a request names is resolved under the output directory first
(launcher.board.views.inside) and refused with 404 otherwise. Requests whose Host header is not the
address the board was started on are refused too, so a web page elsewhere cannot read runs through
a DNS name it points at 127.0.0.1 (DNS rebinding), and so are requests without the board's token
(launcher.board.auth), so that another user of the machine cannot read runs through it.
"""

from __future__ import annotations

import logging
import socket
import sys
from pathlib import Path
from typing import Any, Optional, Set

import plotly
from flask import Flask, abort, jsonify, request, send_file, send_from_directory

from launcher.board.auth import QUERY, require_token
from launcher.board.groups import group_row, group_view
from launcher.board.runlist import board_runs
from launcher.board.files import NotServed, inside
from launcher.board.views import log_view, run_view

STATIC = Path(__file__).parent / "static"
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
LOG_LINES = 500
PAGES = {"page"}  # the endpoint a person opens: a token in its query moves into a cookie


def create_app(root: Path, allowed: Set[str]) -> Flask:
    """The board for the runs under root, answering requests addressed to one of allowed ("host:port"),
    a set the caller may fill once it knows its port."""
    app = Flask(__name__, static_folder=None)

    @app.before_request
    def only_our_host() -> None:
        if request.host not in allowed:
            abort(403)

    @app.after_request
    def no_sniffing(response: Any) -> Any:
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.get("/")
    @app.get("/run")
    @app.get("/logs")
    def page() -> Any:
        return send_from_directory(STATIC, "board.html")

    @app.get("/static/plotly.min.js")
    def plotly_js() -> Any:
        return send_file(PLOTLY_JS, mimetype="text/javascript")

    @app.get("/static/<name>")
    def static_file(name: str) -> Any:
        return send_from_directory(STATIC, name)  # werkzeug's safe_join: nothing outside STATIC

    @app.get("/api/runs")
    def runs() -> Any:
        return jsonify({"root": str(root), "runs": board_runs(root)})

    @app.get("/api/run")
    def run() -> Any:
        folder = _folder(root)
        group = group_row(folder)
        return jsonify(group_view(folder, root, group) if group else run_view(folder))

    @app.get("/api/logs")
    def logs() -> Any:
        folder = _folder(root)
        rank = request.args.get("rank", "all")
        if rank != "all" and not rank.isdigit():
            abort(400)
        count = request.args.get("tail", str(LOG_LINES))
        try:
            return jsonify(log_view(folder, None if rank == "all" else int(rank),
                                    int(count) if count.isdigit() else LOG_LINES, request.args.get("grep", "")))
        except NotServed:  # a symlinked log: it could lead outside the folder
            abort(404)

    return app


def _folder(root: Path) -> Path:
    """The run folder the request's ?path= names, only when it lies under root and is a directory."""
    folder = inside(root, request.args.get("path", ""))
    if folder is None or not folder.is_dir() or folder == root.resolve():
        abort(404)
    return folder


def bind(host: str, port: int) -> socket.socket:
    """The listening socket (port 0: a free one); an OSError says why it cannot be had (in use, no such address)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def serve(root: Path, host: str, sock: socket.socket, token: Optional[str]) -> None:
    """Serve on sock until interrupted, answering only requests with token (None: every request);
    prints the URL first, with the token: the only place the token is ever written."""
    from werkzeug.serving import make_server

    allowed: Set[str] = set()
    bound = sock.getsockname()[1]
    app = create_app(root, allowed)
    if token is not None:
        require_token(app, token, bound, PAGES)
    # werkzeug takes the bound socket as is (fd=): its own bind would end the process on an address in use
    server = make_server(host, bound, app, threaded=True, fd=sock.fileno())
    shown = f"[{host}]" if ":" in host else host
    allowed.add(f"{shown}:{bound}")
    if host in ("127.0.0.1", "::1"):
        allowed.add(f"localhost:{bound}")
    # not a line per poll; and werkzeug's request lines would carry a ?token= query
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    if token is None:
        print(f"warning: --no-token: anyone who can reach {shown}:{bound} (every user of this machine) can read "
              f"the runs under {root} through the board", file=sys.stderr, flush=True)
    query = f"?{QUERY}={token}" if token is not None else ""
    print(f"board: http://{shown}:{bound}/{query} (runs under {root}; Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        sock.close()
