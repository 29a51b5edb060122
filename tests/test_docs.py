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


# Files a comment or a page might point at that are not the project's (the developers' own notes, their machines'
# folders): a reader of the repository has none of them. Anything worth citing is written into the repository.
OUTSIDE = re.compile(r"FACTS\.md|STYLE\.md|DEVELOPERS\.md|MACHINES\.md|\.\./shared/|(?<![\w.-])/work/")
CITING = ("launcher", "trainers", "cluster", "configs", "tests", "bench", "docs", ".ci")


def test_the_project_cites_only_its_own_files() -> None:
    files = [REPO / name for name in ("README.md", "setup.cfg", "pyproject.toml", "mkdocs.yml")]
    files += [p for folder in CITING for p in sorted((REPO / folder).rglob("*"))
              if p.is_file() and p.suffix in ("", ".py", ".md", ".sh", ".yaml", ".yml", ".cfg", ".toml", ".txt", ".js", ".html")]
    this = Path(__file__).resolve()
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()[:100]}" for p in files if p.resolve() != this and p.is_file()
             for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert not found, "points at files outside the repository:\n" + "\n".join(found)


# Commands in a recipe that act on processes or files by name, not on the reader's own by id: on a shared machine
# they reach other users' work (`ray stop` stops every Ray process on the machine, their clusters too). A recipe
# stops what it started by its pid and removes only the folders it made.
BY_NAME = [
    (re.compile(r"\b(pkill|killall|skill|slay)\b"), "kills processes by name"),
    (re.compile(r"\bpgrep\b.*\|\s*xargs\s+kill\b|\bkill\b[^#\n]*\$\((pgrep|pidof)\b"), "kills processes found by name"),
    (re.compile(r"\bkill\s+(-\w+\s+)*(-1|0)(\s|$)"), "signals every process it may"),
    (re.compile(r"\bfuser\s+(-\w+\s+)*-\w*k"), "kills whatever holds a file"),
    (re.compile(r"\bray\s+stop\b"), "stops every Ray process on the machine"),
    (re.compile(r"\bscancel\b.*\s(-u|--user|-n|--name|--me)\b"), "cancels jobs by user or name"),
    (re.compile(r"\brm\s+(-\w*[rR]\w*\s+)+(\"|')?(/|~|\$HOME|\$\{HOME\}|/tmp|/var/tmp|/dev/shm)/?\*?(\"|')?(\s|$)"),
     "removes a shared folder"),
    (re.compile(r"\brm\s+(-\w+\s+)*\S*(/tmp|/var/tmp|/dev/shm)/\S*\*"), "removes by a pattern in a shared folder"),
]


def code_lines(text: str):
    """The lines of a page's code: fenced blocks, and blocks indented four spaces after a blank line (prose that
    names a command to warn of it is not a recipe)."""
    fenced, previous_blank, indented = False, True, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        indented = line.startswith("    ") and (indented or previous_blank) and not fenced
        if fenced or indented:
            yield number, line
        previous_blank = not line.strip()


def acts_by_name(line: str):
    return next((why for pattern, why in BY_NAME if pattern.search(line)), None)


@pytest.mark.parametrize("line", ["    ray stop", "pkill -f ray", "killall python", "kill $(pgrep -f launcher)",
                                  "pgrep -f raylet | xargs kill -9", "kill -9 -1", "fuser -k 6379/tcp",
                                  "scancel -u $USER", "scancel --name train", "rm -rf /tmp/*", "rm -rf ~",
                                  "rm -r \"$HOME\"", "rm -rf /tmp/ray*", "sudo rm -fr /dev/shm/*"])
def test_a_command_that_acts_by_name_is_caught(line: str) -> None:
    assert acts_by_name(line), line


@pytest.mark.parametrize("line", ["kill $NODE $HEAD", "kill -TERM \"$HEAD\"", "scancel 19", "scancel --signal=USR2 JOB_ID",
                                  "rm -rf /tmp/readme-sw", "rm -r \"$RUNS\"", "python -m launcher cancel launcher_runs/RUN_ID",
                                  "ray start --head --block --node-ip-address 127.0.0.1"])
def test_a_command_on_its_own_processes_and_folders_is_not(line: str) -> None:
    assert acts_by_name(line) is None, line


def test_no_recipe_in_the_docs_acts_on_processes_or_files_by_name() -> None:
    pages = [README, *sorted((REPO / "docs").rglob("*.md"))]
    found = [f"{page.relative_to(REPO)}:{number}: {line.strip()} ({why})" for page in pages
             for number, line in code_lines(page.read_text(encoding="utf-8")) if (why := acts_by_name(line))]
    assert not found, "recipes that act by name (stop what you started by its pid):\n" + "\n".join(found)


def test_the_ray_recipe_binds_loopback_and_stops_its_own_nodes_by_pid() -> None:
    recipe = (REPO / "docs" / "ray.md").read_text(encoding="utf-8").split("## Try it locally", 1)[1]
    starts = [line for _, line in code_lines(recipe) if line.lstrip().startswith("ray start")]
    # on loopback, and not 127.0.0.1, which Ray replaces by the machine's network address (docs/ray.md says why)
    assert len(starts) == 2 and all(re.search(r"--node-ip-address 127\.(?!0\.0\.1\b)", line) and "--block" in line
                                    and "& " in line for line in starts), starts
    assert any(re.search(r"\bkill\b.*\$NODE.*\$HEAD", line) for _, line in code_lines(recipe)), recipe
