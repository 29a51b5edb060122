"""What produced a run, recorded in its directory: env/<host>.json (+ env/git.diff, env/packages.txt).

The code's git commit and dirty flag (the diff saved), the script's SHA-256, the installed packages,
torch's build (CUDA, NCCL, cuDNN), torch.utils.collect_env-style facts (OS, Python, CPUs, memory,
GPUs), the host, the command line and the environment variables that steer a distributed run.
Secrets are redacted (launcher.config.secrets) before anything is written.

It runs in a background thread at the lowest CPU priority and never imports torch (its version
file and the package metadata say what is needed), so the workers' start is not delayed (bench/
env_capture.py measures it); finish() waits for it briefly so a short run still gets its record.
"""

from __future__ import annotations

import ast
import email.parser
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from launcher.config.secrets import REDACTED, redact, redact_argv, redact_text

ENV_DIR = "env"
OFF = "LAUNCHER_ENV_CAPTURE"  # =0 turns the record off (docs/many-runs.md)
# Environment variables that change how a distributed job runs; names are prefixes unless they end in "$".
DISTRIBUTED_ENV = re.compile(
    r"^(NCCL_|GLOO_|OMP_|MKL_|KMP_|CUDA_|CUDNN_|NVIDIA_|TORCH|PYTORCH_|MASTER_|SLURM_|UCX_|FI_|"
    r"(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|PYTHONPATH|PYTHONHASHSEED|LD_LIBRARY_PATH|"
    r"LD_PRELOAD|HOSTNAME|WANDB_MODE|WANDB_PROJECT|HF_HOME)$)")
GIT_TIMEOUT_S = 10
_thread: Optional[threading.Thread] = None
LAUNCHER_ROOT = Path(__file__).resolve().parents[2]


def start(run_dir: Path, script: Optional[str], module: bool, write: Callable[[Path, str], None]) -> None:
    """Record this launcher's environment into run_dir/env/ in the background (once per process).

    write(path, text): how a file of the run directory is written (launcher.rundir.write_atomic)."""
    global _thread
    if os.environ.get(OFF, "1") == "0" or _thread is not None:
        return
    argv = [sys.executable, "-m", "launcher", *sys.argv[1:]]
    environ = dict(os.environ)  # as the user set it, before the launcher adds its own (those are in plan.json)
    _thread = threading.Thread(target=_capture_quietly, args=(Path(run_dir), script, module, argv, environ, write),
                               name="launcher-env-capture", daemon=True)
    _thread.start()


def wait(timeout_s: float = 10.0) -> None:
    """Give the record time to be written before the process ends (a short run ends before it does)."""
    if _thread is not None:
        _thread.join(timeout_s)


def _capture_quietly(run_dir: Path, script: Optional[str], module: bool, argv: List[str], environ: Dict[str, str],
                     write: Callable[[Path, str], None]) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only (Linux), and its git calls
    except (OSError, AttributeError):
        pass
    try:
        write_record(run_dir, collect(script, module, argv, environ), write)
    except Exception as e:  # a record of the environment is worth less than the run: say so, go on
        import logging

        logging.getLogger("launcher").debug(f"environment not recorded in {run_dir / ENV_DIR}: {e}")


def collect(script: Optional[str], module: bool, argv: List[str], environ: Dict[str, str]) -> Dict[str, Any]:
    started = time.monotonic()
    code_dir = _code_dir(script, module)
    packages = installed_packages()
    record: Dict[str, Any] = {
        "host": socket.gethostname(),
        "fqdn": socket.getfqdn(),
        "captured_at": time.time(),
        "command": redact_argv(argv),
        "cwd": os.getcwd(),
        "script": script_facts(script, module),
        "git": git_facts(code_dir),
        "torch": torch_facts(packages),
        "system": system_facts(),
        "env": distributed_env(environ),
        "packages": len(packages),
    }
    record["capture_s"] = round(time.monotonic() - started, 3)
    record["_packages"] = packages
    return record


def write_record(run_dir: Path, record: Dict[str, Any], write: Callable[[Path, str], None]) -> None:
    folder = run_dir / ENV_DIR
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", record["host"]) or "host"
    packages = record.pop("_packages")
    diff = record["git"].pop("diff", "")
    if diff:
        write(folder / "git.diff", redact_text(diff))
        record["git"]["diff_file"] = f"{ENV_DIR}/git.diff"
    write(folder / "packages.txt", "".join(f"{name}=={version}\n" for name, version in packages))
    write(folder / f"{host}.json", json.dumps(record, indent=2, default=str) + "\n")


def installed_packages() -> List[List[str]]:
    """`pip freeze` without running pip: every distribution on sys.path, name and version (sorted)."""
    seen: Dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        # the header block only: dist.metadata parses each whole file, long description and all, and
        # dist.version parses it again (0.37 CPU-s for 200 packages, against 0.06 here; same names and versions)
        text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
        header = email.parser.HeaderParser().parsestr(text.split("\n\n", 1)[0])
        name, version = header.get("Name"), header.get("Version")
        if name and name.lower() not in seen:
            seen[name.lower()] = f"{name}=={version}"
    return [entry.split("==", 1) for _, entry in sorted(seen.items())]


def script_facts(script: Optional[str], module: bool) -> Dict[str, Any]:
    if script is None:  # the built-in trainer's file, found without importing it
        package = importlib.util.find_spec("launcher.trainers")
        trainer = Path(package.origin if package and package.origin else "").resolve().parent / "train.py"
        return {"kind": "built-in trainer", "path": str(trainer), "sha256": _sha256(trainer)}
    path = _module_file(script) if module else Path(script)
    facts: Dict[str, Any] = {"kind": "module" if module else "script", "name": script}
    if path is not None and path.is_file():
        facts.update(path=str(path.resolve()), sha256=_sha256(path), bytes=path.stat().st_size)
    return facts


def git_facts(code_dir: Path) -> Dict[str, Any]:
    """The commit of the repository that holds the code, whether its tree differs from it, and how."""
    if shutil.which("git") is None:
        return {"repo": None, "note": "git is not installed"}
    root = _git(code_dir, "rev-parse", "--show-toplevel")
    if root is None:
        return {"repo": None, "note": f"{code_dir} is not in a git repository"}
    commit = _git(code_dir, "rev-parse", "HEAD")
    status = _git(code_dir, "status", "--porcelain", "--untracked-files=no") or ""
    facts: Dict[str, Any] = {"repo": root, "commit": commit, "branch": _git(code_dir, "rev-parse", "--abbrev-ref", "HEAD"),
                             "dirty": bool(status.strip()), "changed_files": len(status.splitlines())}
    if facts["dirty"]:
        facts["diff"] = _git(code_dir, "diff", "HEAD", strip=False) or ""
    return facts


def torch_facts(packages: List[List[str]]) -> Dict[str, Any]:
    """torch's build, read from torch/version.py and the package metadata: no `import torch` (2 s here)."""
    versions = {name.lower(): version for name, version in packages}
    facts: Dict[str, Any] = {"version": versions.get("torch")}
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.submodule_search_locations:
        facts.update(_assignments(Path(list(spec.submodule_search_locations)[0]) / "version.py",
                                  ("__version__", "cuda", "hip", "git_version", "debug")))
        if "__version__" in facts:
            facts["version"] = facts.pop("__version__")
    nccl = [v for n, v in versions.items() if n.startswith("nvidia-nccl")]
    cudnn = [v for n, v in versions.items() if n.startswith("nvidia-cudnn")]
    facts["nccl"] = nccl[0] if nccl else None  # a CPU build has none
    facts["cudnn"] = cudnn[0] if cudnn else None
    return facts


def system_facts() -> Dict[str, Any]:
    """What torch.utils.collect_env reports that needs no torch: OS, Python, CPUs, memory, GPUs and driver."""
    facts: Dict[str, Any] = {"os": platform.platform(), "python": sys.version.split()[0], "machine": platform.machine(),
                             "cpus": os.cpu_count(), "cpu_model": _cpu_model(), "memory_gb": _memory_gb()}
    facts.update(gpu_facts())
    return facts


def gpu_facts() -> Dict[str, Any]:
    if shutil.which("nvidia-smi") is None:
        return {"gpus": []}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=GIT_TIMEOUT_S).stdout
    except (OSError, subprocess.SubprocessError):
        return {"gpus": [], "note": "nvidia-smi did not answer"}
    gpus = [dict(zip(("name", "driver", "memory"), (p.strip() for p in line.split(",")))) for line in out.splitlines() if line.strip()]
    return {"gpus": gpus}


def distributed_env(environ: Dict[str, str]) -> Dict[str, str]:
    """The variables that steer a distributed run, secrets redacted (by name, and by the shape of the value)."""
    chosen = {k: v for k, v in sorted(environ.items()) if DISTRIBUTED_ENV.match(k)}
    return {k: (REDACTED if v and v != redact(v) else v) for k, v in redact(chosen).items()}


def _code_dir(script: Optional[str], module: bool) -> Path:
    if script is None:
        return LAUNCHER_ROOT
    path = _module_file(script) if module else Path(script)
    return path.resolve().parent if path is not None and path.exists() else Path.cwd()


def _module_file(name: str) -> Optional[Path]:
    """Where `python -m name` would find its file, looked up without importing (importing runs user code)."""
    parts = name.split(".")
    for base in [os.getcwd(), *sys.path]:
        for candidate in (Path(base, *parts).with_suffix(".py"), Path(base, *parts, "__main__.py")):
            if candidate.is_file():
                return candidate
    return None


def _git(cwd: Path, *args: str, strip: bool = True) -> Optional[str]:
    try:
        done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() if strip else done.stdout


def _assignments(path: Path, names: tuple) -> Dict[str, Any]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    found: Dict[str, Any] = {}
    for node in tree.body:
        if not isinstance(node, (ast.AnnAssign, ast.Assign)):
            continue
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
        if isinstance(target, ast.Name) and target.id in names and node.value is not None:
            try:
                found[target.id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return found


def _sha256(path: Path) -> Optional[str]:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _cpu_model() -> Optional[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_gb() -> Optional[float]:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None
