"""The board answers only its user: every request needs the token of the URL it prints (or the cookie
that URL leaves), checked over HTTP, in a real headless chromium, and as a second real user of the machine."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Iterator, Optional

import pytest

from tests.board_helpers import board, browser_page, get, needs_browser, read_url
from tests.helpers import QUIET, kill_group, launcher_env, run_bounded, run_launcher

pytestmark = pytest.mark.timeout(300)
PATHS = ("/", "/run?path=done", "/logs?path=done", "/api/runs", "/api/run?path=done", "/api/logs?path=done&rank=all",
         "/static/board.js", "/static/plotly.min.js", "/nope")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """An output directory with one real completed run, written under umask 077 (nobody else may read it)."""
    out = tmp_path_factory.mktemp("token-runs")
    old = os.umask(0o077)
    try:
        result = run_launcher(["--gpus", "1", f"output_dir={out}", "run_id=done", "trainer.steps=10",
                               "trainer.log_every=2", *QUIET], cwd=out, timeout=240)
    finally:
        os.umask(old)
    assert result.returncode == 0, result.stderr
    assert (out / "done").stat().st_mode & 0o077 == 0
    return out


def cookie_name(base: str) -> str:
    return f"launcher_board_{urllib.parse.urlsplit(base).port}"


def raw_get(base: str, path: str) -> http.client.HTTPResponse:
    """One GET, redirects not followed (urllib would follow them, without the cookie)."""
    parts = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    connection.request("GET", path)
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def test_every_request_without_the_token_is_refused(runs):
    with board(runs) as b:
        token, name = b.token, cookie_name(b.base)
        assert token and len(token) >= 40 and b.printed == f"{b.base}/?token={token}", b.printed
        other = "y" if token[0] == "x" else "x"  # a token may itself start with "x" (1 in 64): then "x" + token[1:] is it
        wrong = (other + token[1:], token[:-1], "", other * len(token))
        for path in PATHS:
            status, body = get(b.base + path)
            assert status == 403 and len(body) < 200 and b"token" in body, (path, status, body)
            sep = "&" if "?" in path else "?"
            for guess in wrong:
                assert get(f"{b.base}{path}{sep}token={guess}")[0] == 403, (path, guess)
                assert get(b.base + path, headers={"Cookie": f"{name}={guess}"})[0] == 403, (path, guess)
            assert get(b.base + path, headers={"Cookie": f"launcher_board_1={token}"})[0] == 403  # another port's
        assert json.loads(get(b.url("/api/runs"))[1])["runs"][0]["run_id"] == "done"
        for path in PATHS[:-1]:
            assert get(b.base + path, headers={"Cookie": f"{name}={token}"})[0] == 200, path
            if path.startswith(("/api/", "/static/")):  # a page's ?token= redirects (the next test)
                assert get(b.url(path))[0] == 200, path
        assert get(b.url("/nope"))[0] == 404 and get(b.url("/api/logs?path=done&rank=x"))[0] == 400
        b.proc.terminate()
        rest, _ = b.proc.communicate(timeout=30)
    # printed once, on the URL line: never in a request line, the run directory or anything the board wrote
    assert b.console.count(token) == 1 and token not in rest, b.console + rest
    assert not [p for p in runs.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]


def test_a_page_opened_with_the_token_keeps_it_in_a_cookie_and_redirects_without_it(runs):
    with board(runs) as b:
        opened = raw_get(b.base, f"/run?path=done&rank=1&token={b.token}")
        assert opened.status == 303 and opened.getheader("Location") == "/run?path=done&rank=1"
        cookie = [part.strip() for part in opened.getheader("Set-Cookie").split(";")]
        assert cookie[0] == f"{cookie_name(b.base)}={b.token}", cookie
        assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= set(cookie) and not any("Expires" in c for c in cookie)
        assert raw_get(b.base, f"/?token={b.token}").getheader("Location") == "/"
        api = raw_get(b.base, f"/api/runs?token={b.token}")  # a client with the token in its query: answered as is
        assert api.status == 200 and api.getheader("Set-Cookie") is None


@needs_browser
def test_the_printed_url_opens_the_board_in_a_browser_and_nothing_else_does(runs):
    with board(runs) as b, browser_page() as page:
        page.goto(b.printed)
        assert page.url == b.base + "/"  # the token has left the address bar
        page.wait_for_selector("#runs tbody tr.run")
        assert page.get_attribute("#runs tbody tr.run", "data-run-id") == "done"
        cookies = [c for c in page.context.cookies() if c["name"] == cookie_name(b.base)]
        assert len(cookies) == 1 and cookies[0]["value"] == b.token, cookies
        assert cookies[0]["httpOnly"] and cookies[0]["sameSite"] == "Strict" and cookies[0]["path"] == "/"
        assert page.evaluate("document.cookie") == ""  # the page's scripts cannot read it
        page.click("#runs a:text('done')")  # a link within the board: the cookie, no token
        page.wait_for_selector("#heatmap .main-svg")
        assert page.url == b.base + "/run?path=done" and page.inner_text("#step") == "step 10/10"
        assert page.locator("#loss .scatterlayer .trace").count() == 1
        assert page.errors == []
        with_cookie = "fetch('/api/runs').then(r => r.status)"
        without = "fetch('/api/runs', {credentials: 'omit'}).then(r => r.status)"
        assert page.evaluate(with_cookie) == 200 and page.evaluate(without) == 403
        stranger = page.context.browser.new_context().new_page()  # another browser profile: no cookie
        try:
            assert stranger.goto(b.base + "/run?path=done").status == 403
            assert stranger.goto(b.base + "/api/run?path=done").status == 403
        finally:
            stranger.context.close()


def test_no_token_serves_everyone_after_a_warning_on_stderr(runs):
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "board", str(runs), "--port", "0", "--no-token"], cwd=runs,
                            env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        printed, _ = read_url(proc, timeout=60)
        assert printed.endswith("/") and "token" not in printed, printed
        for path in PATHS[:-1]:
            assert get(printed.rstrip("/") + path)[0] == 200, path
    finally:
        kill_group(proc)
        _, err = proc.communicate(timeout=30)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: --no-token: ") and "every user of this machine" in lines[0], err


def _no_second_user() -> Optional[str]:
    """Why a second real user cannot be had here, or None: root adds (and removes) a temporary one."""
    if os.geteuid() != 0:
        return "not root: cannot add a temporary user"
    missing = [tool for tool in ("useradd", "userdel", "runuser", "ps") if shutil.which(tool) is None]
    if missing or SYSTEM_PYTHON is None:
        return f"missing here: {', '.join(missing or ['a system python3'])}"
    return None


SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")  # the venv's may not be theirs to run
NO_SECOND_USER = _no_second_user()
STATUS = ("import sys, urllib.request, urllib.error\n"
          "try:\n    print(urllib.request.urlopen(sys.argv[1], timeout=30).status)\n"
          "except urllib.error.HTTPError as e:\n    print(e.code)\n")


@contextlib.contextmanager
def temporary_user() -> Iterator[str]:
    name = f"lbtok{secrets.token_hex(4)}"
    added = run_bounded(["useradd", "--no-create-home", "--shell", "/bin/sh", name], Path("/"), timeout=60)
    assert added.returncode == 0, added.stderr
    try:
        yield name
    finally:
        removed = run_bounded(["userdel", name], Path("/"), timeout=60)
        assert removed.returncode == 0, removed.stderr


@pytest.mark.skipif(NO_SECOND_USER is not None, reason=str(NO_SECOND_USER))
def test_another_user_of_the_machine_is_refused_without_the_token(runs):
    """As root: a temporary real user runs its own client against the board, as any user of the machine could."""
    with temporary_user() as user, board(runs) as b:
        def as_user(*argv: str) -> subprocess.CompletedProcess:
            return run_bounded(["runuser", "-u", user, "--", *argv], Path("/"), timeout=60)

        def status(url: str) -> int:
            done = as_user(SYSTEM_PYTHON, "-c", STATUS, url)
            assert done.returncode == 0, done.stderr
            return int(done.stdout)

        denied = as_user(SYSTEM_PYTHON, "-c", "import sys; open(sys.argv[1]).read()", str(runs / "done" / "metrics.jsonl"))
        assert denied.returncode != 0 and "PermissionError" in denied.stderr, denied  # the run is not theirs to read
        for path in PATHS:
            assert status(b.base + path) == 403, path  # and the board does not read it for them
        listing = as_user("ps", "-eo", "args")
        assert listing.returncode == 0 and "launcher board" in listing.stdout and b.token not in listing.stdout
        assert status(b.url("/api/runs")) == 200  # the token is what counts, not who asks
