"""The board's token: who may read runs through it. Every request must carry the token, in the query
string (the URL the board prints, as Jupyter's) or in the cookie the first visit leaves.

Without it, any user of the machine could read a umask-077 run through the board's loopback port.
The token lives only in this process and on the board's console line: never in a file or a log.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any, Collection, Optional
from urllib.parse import urlencode

from flask import Flask, Response, redirect, request

QUERY = "token"
REFUSED = "403: this board answers only requests with its token: open the URL it printed (.../?token=...)\n"


def new_token() -> str:
    return secrets.token_urlsafe(32)


def cookie_name(port: int) -> str:
    """Per port: a browser sends 127.0.0.1's cookies to every port, and two boards must not overwrite each other's."""
    return f"launcher_board_{port}"


def matches(given: Optional[str], token: str) -> bool:
    """Constant time, so the response time does not tell how much of a guess was right."""
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def require_token(app: Flask, token: str, port: int, pages: Collection[str]) -> None:
    """Refuse (403) every request to app without the token. A page (an endpoint in pages) opened with the
    token in its query gets the token as a cookie and is redirected to itself without it, so the token
    leaves the address bar and history, and the page's links and API calls carry the cookie."""
    cookie = cookie_name(port)

    @app.before_request
    def only_with_token() -> Any:
        in_query = matches(request.args.get(QUERY), token)
        if not in_query and not matches(request.cookies.get(cookie), token):
            return Response(REFUSED, status=403, mimetype="text/plain")
        if not in_query or request.method != "GET" or request.endpoint not in pages:
            return None  # an API call or a file with ?token= is answered as it is: nothing to keep
        rest = [(k, v) for k, v in request.args.items(multi=True) if k != QUERY]
        response = redirect(request.path + (f"?{urlencode(rest)}" if rest else ""), code=303)
        response.set_cookie(cookie, token, httponly=True, samesite="Strict", path="/")
        return response
