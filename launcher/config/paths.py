"""Checks on the paths and names a config points at, made before anything is created: the --config file, the
script or module to run, and where checkpoints go. Unlike launcher.config.inputs these look at the file system (and, for a dotted
module, import its parent packages, as `python -m` would)."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Optional

import launcher.configs as shipped_configs
from launcher.config.inputs import check_no_tilde, misread_override
from launcher.errors import ConfigError
from launcher.runtime.formatting import first_line
from launcher.runtime.objects import unusable

CONFIG_DIR = Path(shipped_configs.__file__).resolve().parent  # the repository's configs/, installed as launcher.configs
URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")  # s3://, gs://, hdfs://, file://: not a local path


def resolve_config_path(name: str) -> Path:
    """A --config value: a file path, or the name of a YAML file shipped in configs/."""
    if not name.strip():
        raise ConfigError("--config was given an empty name: pass a YAML file's path or a shipped config's name, "
                          "or leave --config out")
    path = Path(name)
    if path.is_file():
        return path
    shipped = CONFIG_DIR / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")
    if shipped.is_file():
        return shipped
    if path.is_dir():
        raise ConfigError(f"--config {name} is a directory: pass a YAML file")
    if path.exists():  # /dev/null, a FIFO, a socket: reading it would give nothing or never end
        raise ConfigError(f"--config {name} is not a regular file: pass a YAML file")
    choices = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
    raise ConfigError(f"--config {name}: no such file (shipped configs: {choices})")


def check_script(path: str, module: bool) -> None:
    """The script file exists, or the module can be found where the workers will look (cwd first)."""
    if module:
        check_module(path)
    elif os.path.isdir(path):
        raise ConfigError(f"script {path} is a directory: pass a .py file, or -m package.module")
    elif not os.path.isfile(path):
        raise ConfigError(misread_override(path) or f"script {path} does not exist: check the path (or use -m for a module)")


def check_module(name: str) -> None:
    """`-m NAME` names a module `python -m` would find. Only its parent packages are imported (a dotted name
    needs them to be found); the module itself is not run or imported."""
    sys.path.insert(0, os.getcwd())  # the workers look in their cwd first, as `python -m` does
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as e:  # a parent package is missing or failed to import; an empty name
        raise ConfigError(f"-m {name}: cannot be found ({e.__class__.__name__}: {first_line(e)}): "
                          "check the name, and that its package is installed in this environment") from e
    except Exception as e:  # a parent package's own code raised while it was imported
        raise ConfigError(f"-m {name}: importing its parent package failed ({e.__class__.__name__}): "
                          "run `python -c 'import PACKAGE'` to see why") from e
    finally:
        sys.path.remove(os.getcwd())
    if spec is None:
        raise ConfigError(f"-m {name}: no such module here: check the name, run from the folder that holds it, "
                          "or install its package in this environment")


def check_checkpoint_dir(path: Optional[str]) -> None:
    """checkpoint.dir is a local directory (made when the run starts) or an object-store URL whose fsspec
    implementation is installed, not an existing file. Whether the store answers is checked at launch
    (launcher.backends.dispatch), not here: validating a config touches no network."""
    if path is None:
        return
    if URL_SCHEME.match(path):
        check_store_url(path, "checkpoint.dir")
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"checkpoint.dir={path} is an existing file, not a directory: give a directory's path "
                          "(it is made if missing)")


def check_output_dir(path: str, cluster: str) -> None:
    """output_dir is a local folder, or an object-store URL for a job launched from here (launcher.objectstore):
    a SLURM or Ray job's nodes write their run directory themselves, on a shared folder."""
    check_no_tilde(path, "output_dir")
    if not URL_SCHEME.match(path):
        return
    if cluster != "local":
        raise ConfigError(f"output_dir={path}: an object-store output_dir is for jobs launched here, not --cluster "
                          f"{cluster}: give a folder the nodes share, and checkpoint.dir={path.rstrip('/')}/... for the checkpoints")
    check_store_url(path, "output_dir")


def check_store_url(url: str, key: str) -> None:
    """An object-store checkpoint.dir or output_dir: no credentials in it (they would be recorded in config.yaml),
    a bucket, and a scheme whose fsspec implementation is installed (s3fs, gcsfs: the [s3] and [gcs] extras)."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() == "file":
        raise ConfigError(f"{key}={url}: give the local path itself, without file://")
    if "@" in rest.split("/", 1)[0]:
        raise ConfigError(f"{key}: credentials do not belong in the URL (they would be recorded with the run): "
                          f"write {scheme}://BUCKET/PREFIX and set them in the environment (AWS_ACCESS_KEY_ID, "
                          "AWS_SECRET_ACCESS_KEY, AWS_PROFILE)")
    problem = unusable(url)  # a bucket, a scheme that keeps a record, its package (launcher.runtime.store_problems)
    if problem:
        raise ConfigError(f"{key}={shown(url)}: {problem}")


def shown(url: str) -> str:
    """A URL for a one-line message: its control characters escaped, so the line stays one and says what it holds."""
    return url.encode("unicode_escape", "backslashreplace").decode("ascii") if not url.isprintable() else url
