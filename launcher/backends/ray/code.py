"""The code a Ray job runs: the submitting folder, shipped to every node as the job's runtime_env working_dir.

Ray zips the folder once at the driver's ray.init, unpacks it on each node and starts the actors there
(so a node agent, its workers and a relative script path see the shipped copy). Ray itself leaves out
what .gitignore and .rayignore files name; EXCLUDES below adds the folders no job needs (.git, virtual
environments, caches) and the job's own output folder where it lies inside. The size is measured here
with Ray's own walk, before anything is placed: a folder over ray.ship_limit_mb is refused in one line.
Symbolic links are left out, each by its own exclude, and named in one warning: Ray's zip follows them (a
link to a file ships the file's bytes, wherever it lies: ~/.aws/credentials as well as a dataset; a link to a
folder is walked, a link to "." until the path is too long), and the nodes would get what the link pointed at
on the submitting machine, never a link.
With ray.ship_code=false nothing is shipped and the nodes run the code already at the same paths.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from launcher.backends.ray.options import ray_section
from launcher.config.schema import Config
from launcher.errors import ConfigError

EXCLUDES = (".git", ".venv", "venv", ".env", "__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache",
            ".ruff_cache", ".tox", ".nox", "node_modules", ".ipynb_checkpoints", "wandb")
MIB = 1024 * 1024
GITIGNORE_SPECIAL = "\\*?[]!#"  # characters a gitignore-style pattern reads as syntax: escaped in a link's path
log = logging.getLogger("launcher")


class _TooBig(Exception):
    """Raised from inside Ray's walk to stop it at the limit: a home folder is not walked to its end."""


def excludes(cfg: Config, folder: Path) -> List[str]:
    """gitignore-style patterns (relative to folder) on top of its .gitignore and .rayignore files."""
    found = list(EXCLUDES)
    try:
        inside = Path(cfg.output_dir).resolve().relative_to(folder.resolve())
    except ValueError:
        return found  # the output folder lies elsewhere
    if str(inside) in ("", "."):
        raise ConfigError(f"output_dir={cfg.output_dir} is the working folder that --cluster ray ships: pick an "
                          "output_dir below or outside it, or set ray.ship_code=false")
    return found + [f"/{inside.as_posix()}"]


def survey(folder: Path, patterns: List[str], stop_at: float) -> Tuple[float, List[str]]:
    """What Ray would zip of folder (its own walk, its own .gitignore/.rayignore handling), counted up to stop_at,
    and the symbolic links that walk meets (relative paths): each is left out, not entered, not counted."""
    from ray._private.runtime_env import packaging  # ray>=2.40; the walk the upload itself takes

    total, links = [0], []
    quiet = logging.getLogger("launcher.ray.code")
    quiet.disabled = True  # Ray logs the ignore files it found, and an error for the walk stopped at the limit

    def count(path: Path) -> None:
        if path.is_file():
            total[0] += path.stat().st_size
            if total[0] > stop_at:
                raise _TooBig()

    def is_link(path: Path) -> bool:  # an exclude of Ray's walk: a link is neither handled nor entered
        if path.is_symlink():
            links.append(path.relative_to(folder).as_posix())
            return True
        return False

    travel: Callable[..., None] = packaging._dir_travel  # its signature differs between Ray releases
    try:
        try:
            travel(folder, [packaging._get_excludes(folder, patterns), is_link], count, include_gitignore=True, logger=quiet)
        except TypeError:  # a Ray before include_gitignore (it read .gitignore files always)
            total[0], links[:] = 0, []
            travel(folder, [packaging._get_excludes(folder, patterns), is_link], count, logger=quiet)
    except _TooBig:
        pass
    return float(total[0]), links


def link_pattern(relative: str) -> str:
    """The exclude that names exactly this path (anchored, its pattern characters escaped)."""
    return "/" + "".join(f"\\{c}" if c in GITIGNORE_SPECIAL else c for c in relative)


def shipped_excludes(cfg: Config, folder: Path) -> List[str]:
    """excludes(), plus one per symbolic link in what would be shipped."""
    patterns = excludes(cfg, folder)
    _, links = survey(folder, patterns, ray_section(cfg).ship_limit_mb * MIB)
    return patterns + [link_pattern(link) for link in links]


def check_size(cfg: Config, folder: Path) -> float:
    """The shipped size in bytes; one line naming the size and the fixes when it is over ray.ship_limit_mb."""
    limit = ray_section(cfg).ship_limit_mb * MIB
    size, links = survey(folder, excludes(cfg, folder), limit)
    if size > limit:
        raise ConfigError(f"the working folder {folder} that --cluster ray ships to every node holds at least "
                          f"{size / MIB:.1f} MiB after excludes (.gitignore, .rayignore, .git, .venv, caches), over "
                          f"ray.ship_limit_mb={ray_section(cfg).ship_limit_mb:g}: list large files in .gitignore or .rayignore, "
                          "raise ray.ship_limit_mb, or set ray.ship_code=false where every node has the code already")
    if links:
        shown = ", ".join(links[:5]) + (f" and {len(links) - 5} more" if len(links) > 5 else "")
        log.warning(f"--cluster ray: {len(links)} symbolic link(s) in {folder} are not shipped ({shown}): Ray would "
                    "ship what they point at. Copy what the job needs into the folder, or set ray.ship_code=false "
                    "where every node has the code already")
    return size


def runtime_env(cfg: Config, folder: Path) -> Optional[Dict[str, Any]]:
    """The job's runtime_env for ray.init: the folder as working_dir; None with ray.ship_code=false."""
    if not ray_section(cfg).ship_code:
        return None
    return {"working_dir": str(folder), "excludes": shipped_excludes(cfg, folder)}


def script_path(cfg: Config, folder: Path) -> Optional[str]:
    """The script as the nodes find it: relative to the shipped folder where it lies inside, else absolute
    (a script outside the folder must be at that path on every node)."""
    if cfg.script.path is None or cfg.script.module:
        return cfg.script.path
    resolved = Path(cfg.script.path).resolve()
    if ray_section(cfg).ship_code:
        try:
            return resolved.relative_to(folder.resolve()).as_posix()
        except ValueError:
            pass
    return str(resolved)


def describe(cfg: Config, folder: Path) -> str:
    """The dry run's line about the code."""
    if not ray_section(cfg).ship_code:
        return f"# code: not shipped (ray.ship_code=false): every node runs what it has at {folder}"
    return (f"# code: {folder} shipped to every node as the runtime_env working_dir, without .gitignore/.rayignore "
            f"entries and {', '.join(excludes(cfg, folder))} (at most ray.ship_limit_mb={ray_section(cfg).ship_limit_mb:g})")


def working_folder() -> Path:
    """The submitting folder: what a user means by "my code" (git-style, the folder the command runs in)."""
    return Path(os.getcwd())
