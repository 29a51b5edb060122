"""Start and stop a real `python -m launcher board` for the board's tests, and drive Debian's chromium."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import select
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple

import psutil
import pytest

from tests.helpers import SESSION_PIDS, kill_group, start_launcher

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)


def _no_browser_reason() -> Optional[str]:
    """Why the browser tests cannot run here, or None: they need a system chromium and playwright (its
    driver only: it never downloads a browser here)."""
    import importlib.util

    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed: pip install -e '.[test]'"
    if CHROMIUM is None:
        return "no chromium binary: apt-get install chromium (tests/run.sh does as root)"
    return None


NO_BROWSER = _no_browser_reason()
needs_browser = pytest.mark.skipif(NO_BROWSER is not None, reason=str(NO_BROWSER))


@dataclass(frozen=True)
class Board:
    """A started board: the URL it printed (with its ?token=, unless --no-token) and what it printed before."""

    printed: str
    console: str
    proc: subprocess.Popen

    @property
    def base(self) -> str:
        """http://HOST:PORT, no path, no token."""
        return base_of(self.printed)

    @property
    def token(self) -> Optional[str]:
        return token_of(self.printed)

    def url(self, path: str) -> str:
        return on_board(self.printed, path)


def base_of(printed: str) -> str:
    parts = urllib.parse.urlsplit(printed)
    return f"{parts.scheme}://{parts.netloc}"


def token_of(printed: str) -> Optional[str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(printed).query)).get("token")


def on_board(printed: str, path: str) -> str:
    """path ("/api/run?path=x") on the board that printed printed, with its token in the query, as a client
    without the cookie must send it (a page opened so moves the token into a cookie and redirects to itself)."""
    url, token = base_of(printed) + path, token_of(printed)
    return url if token is None else f"{url}{'&' if '?' in url else '?'}token={token}"


@contextlib.contextmanager
def board(root: Path, *extra: str, env: Optional[Dict[str, str]] = None) -> Iterator[Board]:
    """A board on a free port serving root; stops it (by its process group) after."""
    proc = start_launcher(["board", str(root), "--port", "0", *extra], cwd=root, env=env)
    try:
        printed, console = read_url(proc, timeout=60)
        yield Board(printed, console, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        kill_group(proc)
        proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()


def wait_for_url(proc: subprocess.Popen, timeout: float) -> str:
    """The URL the board printed, as printed: with its ?token= (unless --no-token)."""
    return read_url(proc, timeout)[0]


def read_url(proc: subprocess.Popen, timeout: float) -> Tuple[str, str]:
    """The URL the board printed, and everything it printed up to and with that line."""
    assert proc.stdout is not None
    deadline, seen = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            seen += line
            match = re.search(r"^board: (http://\S+) ", line)
            if match:
                return match.group(1), seen
            if not line and proc.poll() is not None:
                break
    raise AssertionError(f"the board printed no URL within {timeout}s:\n{seen}")


def get(url: str, host: Optional[str] = None, method: str = "GET",
        headers: Optional[Dict[str, str]] = None) -> Tuple[int, bytes]:
    request = urllib.request.Request(url, method=method, headers={**({"Host": host} if host else {}), **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def get_json(url: str) -> Dict[str, Any]:
    status, body = get(url)
    assert status == 200, (url, status, body[:300])
    return json.loads(body)


class _Browser:
    """One headless chromium per test process, started by the first page a test asks for and closed at the session's
    end (close_browser, from tests/conftest.py): a start costs ~1.5-2 CPU-s with its driver, and each test still gets
    a fresh context (its own cookies, storage and cache). Its processes are the session's (SESSION_PIDS), not
    leftovers."""

    playwright: Any = None
    browser: Any = None


def _browser() -> Any:
    if _Browser.browser is None or not _Browser.browser.is_connected():
        close_browser()
        from playwright.sync_api import sync_playwright

        before = {p.pid for p in psutil.Process().children(recursive=True)}
        _Browser.playwright = sync_playwright().start()
        _Browser.browser = _Browser.playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"],
                                                               env={**os.environ})
        # the driver, chromium, and chromium's crash handlers (they detach from it, to this process: a subreaper); not
        # a process of the test's own that started meanwhile (a board's), which must still end with the test
        SESSION_PIDS.update(p.pid for p in psutil.Process().children(recursive=True)
                            if p.pid not in before and _of_the_browser(p))
    return _Browser.browser


def _of_the_browser(p: psutil.Process) -> bool:
    try:
        command = " ".join(p.cmdline())
    except psutil.Error:
        return False
    return "playwright" in command or "chrom" in command


def close_browser() -> None:
    """Close the shared browser and its driver, if this process started them."""
    browser, playwright = _Browser.browser, _Browser.playwright
    _Browser.browser = _Browser.playwright = None
    try:
        if browser is not None:
            browser.close()
    finally:
        if playwright is not None:
            playwright.stop()


@contextlib.contextmanager
def browser_page() -> Iterator[Any]:
    """A page in a fresh context of the shared headless chromium (the system's binary) that records console errors
    in page.errors."""
    context = _browser().new_context(viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        page.errors = []
        page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        page.set_default_timeout(60_000)
        yield page
    finally:
        context.close()


def screenshot(page: Any, path: Path) -> Dict[str, float]:
    """A full-page PNG at path, decoded back by the browser: its size, its colours and how much is not background."""
    png = page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size == len(png) > 10_000, path
    return page.evaluate("""async (src) => {
      const img = new Image(); img.src = src; await img.decode();
      const canvas = Object.assign(document.createElement("canvas"), {width: img.width, height: img.height});
      const ctx = canvas.getContext("2d"); ctx.drawImage(img, 0, 0);
      const data = ctx.getImageData(0, 0, img.width, img.height).data;
      const counts = new Map();
      for (let i = 0; i < data.length; i += 4) {
        const key = (data[i] >> 3) << 10 | (data[i + 1] >> 3) << 5 | data[i + 2] >> 3;
        counts.set(key, (counts.get(key) || 0) + 1);
      }
      const background = Math.max(...counts.values());
      return {width: img.width, height: img.height, colours: counts.size, drawn: 1 - background / (img.width * img.height)};
    }""", "data:image/png;base64," + base64.b64encode(png).decode())


def assert_not_blank(shot: Dict[str, float], drawn: float) -> None:
    assert shot["width"] >= 1280 and shot["height"] >= 600, shot
    assert shot["colours"] >= 20 and shot["drawn"] >= drawn, shot


# The layout's faults, as the browser lays the page out: a mode bar over any title, a tick label, axis title,
# chart title, legend, colour-bar label or event mark's label outside its chart's svg, a chart with nothing drawn in it.
LAYOUT_FAULTS = """() => {
  const box = e => e.getBoundingClientRect();
  const meets = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const charts = [...document.querySelectorAll(".js-plotly-plot")];
  const titles = charts.flatMap(c => [...c.querySelectorAll(".gtitle")]);
  const faults = [];
  let modebars = 0;
  for (const chart of charts) {
    const svg = box(chart.querySelector(".main-svg"));
    for (const bar of chart.querySelectorAll(".modebar")) {
      modebars += 1;
      for (const title of titles) {
        if (meets(box(bar), box(title))) faults.push(`${chart.id}: the mode bar covers the title "${title.textContent}"`);
      }
    }
    const labels = chart.querySelectorAll(".xtick text, .ytick text, .g-xtitle text, .g-ytitle text, .gtitle, " +
                                          ".colorbar text, .legend text, .annotation-text");
    for (const label of labels) {
      const b = box(label);
      if (!label.textContent || !b.width) continue;
      if (b.left < svg.left - 0.5 || b.right > svg.right + 0.5 || b.top < svg.top - 0.5 || b.bottom > svg.bottom + 0.5)
        faults.push(`${chart.id}: "${label.textContent}" lies outside its chart`);
    }
    if (!chart.querySelector(".scatterlayer .trace, .hm, .bars .point")) faults.push(`${chart.id}: an empty chart`);
  }
  return {charts: charts.map(c => c.id), titles: titles.length, modebars, faults};
}"""


def laid_out(page: Any, charts: int) -> Dict[str, Any]:
    """The page's layout faults once charts charts are drawn, each hovered first (its mode bar shows on hover)."""
    page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg .gtitle').length >= {charts}")
    for chart in page.query_selector_all(".js-plotly-plot"):
        chart.hover()
    page.wait_for_timeout(300)
    return page.evaluate(LAYOUT_FAULTS)
