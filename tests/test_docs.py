"""The documentation holds together: the mkdocs site builds with --strict (mkdocs.yml's `validation` makes a
broken link or anchor, and a page left out of the nav, a warning, and --strict makes a warning a failure),
and README.md stays a short front door whose first screen has the two set-up commands for a fresh machine."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

README = REPO / "README.md"
# The README's two set-up commands for a fresh machine, exactly: the main job, and the whole test suite
# (which .ci/run runs). A terminal's first screen is 24 rows.
SET_UP = ["python3 -m venv .venv && .venv/bin/pip install -q torch==2.13.0 -e . && "
          ".venv/bin/python -m launcher --nodes 1 --gpus 2",
          "bash tests/run.sh"]
FIRST_SCREEN_ROWS = 24
MAX_README_LINES = 300


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `mkdocs build --strict` writes it; the build's own output explains any failure."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                           "-d", str(out)], cwd=REPO, capture_output=True, text=True, timeout=240)
    if "No module named mkdocs" in proc.stderr:
        pytest.fail("mkdocs is not installed: pip install -e '.[docs]' (tests/run.sh does)")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.mark.timeout(300)
def test_the_site_builds_strict_with_every_page(site: Path) -> None:
    pages = sorted(p.stem for p in (REPO / "docs").glob("*.md"))
    assert "index" in pages and len(pages) >= 15, pages
    for page in pages:
        built = site / ("index.html" if page == "index" else f"{page}/index.html")
        assert built.is_file(), f"docs/{page}.md was not built"
    assert (site / "board.png").is_file()  # the board page's screenshot
    assert 'src="../board.png"' in (site / "board" / "index.html").read_text()


@pytest.mark.timeout(300)
def test_the_readmes_links_into_the_docs_resolve(site: Path) -> None:
    """README.md is outside the site, so the strict build does not check its links: this does, anchors too."""
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert any(link.startswith("docs/") for link in local), "the README links into no docs page"
    for link in local:
        path, _, anchor = link.partition("#")
        assert (REPO / path).exists(), f"README links to {path}, which does not exist"
        if anchor and path.startswith("docs/") and path.endswith(".md"):
            stem = Path(path).stem
            html = site / ("index.html" if stem == "index" else f"{stem}/index.html")
            assert f'id="{anchor}"' in html.read_text(), f"README links to {link}: no such heading"


def test_the_readme_is_a_short_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines: move detail into docs/"
    first_screen = lines[:FIRST_SCREEN_ROWS]
    commands = [line.strip() for line in first_screen if line.startswith("    ") and line.strip()]
    assert commands == SET_UP, commands
