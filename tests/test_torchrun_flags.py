"""`python -m launcher` takes torchrun's command line: every flag of `torchrun --help` (torch 2.7-2.15), in both
spellings, means here what it means to torchrun, or is refused in one line (exit 2, no run directory).

The mapping tests are pure (launcher.config.torchrun_flags, device counts faked); the runs at the end start the
command lines of torchrun's documentation and of the pytorch/examples DDP tutorial under torchrun and under the
launcher, and compare what the script sees (tests/test_torchrun_fidelity.py's observer and helpers; the standalone
line's runs are that file's plain observer runs).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import List, Tuple

import pytest

from launcher.config import torchrun_flags
from launcher.config.torchrun_flags import Host, launcher_argv
from launcher.errors import ConfigError
from launcher.usage import parse_args, value_flags
from tests.helpers import free_port, run_launcher
from tests.test_torchrun_fidelity import COMMON_ENV, RUN_TIMEOUT_S, SCRIPTS, env_differences, run_torchrun

pytestmark = pytest.mark.timeout(300)

HOST = Host(cuda_count=lambda: 0, cpu_count=lambda: 6, fresh_id=lambda: "FRESH")  # a CPU machine with 6 cores
GPU_HOST = Host(cuda_count=lambda: 4, cpu_count=lambda: 6, fresh_id=lambda: "FRESH")
RUN_ID = "rdzv.torchelastic_run_id="  # every torchrun line ends its overrides with torchrun's run id (tested below)


def mapped(line: str, host: Host = HOST) -> List[str]:
    """The launcher's line for a torchrun line, less its run id override."""
    notes: List[str] = []
    out = launcher_argv(line.split(), value_flags(), host, notes.append)
    assert not notes, notes
    assert len([t for t in out if t.startswith(RUN_ID)]) <= 1, out
    return [t for t in out if not t.startswith(RUN_ID)]


def run_id_of(line: str) -> str:
    """The workers' TORCHELASTIC_RUN_ID a torchrun line asks for."""
    [item] = [t for t in launcher_argv(line.split(), value_flags(), HOST) if t.startswith(RUN_ID)]
    args, _ = parse_args([item])
    from launcher.config.schema import load_config

    return str(load_config(overrides=args.overrides).rdzv.torchelastic_run_id)


def spellings(flag: str, value: str) -> List[str]:
    """The four ways torchrun reads a flag: dash or underscore, `=` or a space."""
    under = "--" + flag[2:].replace("-", "_")
    return [f"{flag} {value}", f"{flag}={value}", f"{under} {value}", f"{under}={value}"]


@pytest.mark.parametrize("flag, value, expected", [
    ("--nproc-per-node", "2", ["--gpus", "2"]),
    ("--nnodes", "1", ["--nodes", "1"]),
    ("--max-restarts", "3", ["--max-restarts", "3"]),
    ("--log-dir", "/tmp/logs", ["--output-dir", "/tmp/logs"]),
    ("--start-method", "spawn", ["launcher.start_method=spawn"]),
    ("--start-method", "forkserver", ["launcher.start_method=fork"]),  # the warm zygote is a fork server
    ("--monitor-interval", "0.5", ["launcher.monitor_interval_s=0.5"]),
    ("--shutdown-timeout", "20", ["checkpoint.grace_s=20.0"]),
    ("--rdzv-conf", "join_timeout=90", ["rdzv.timeout_s=90"]),
    ("--local-ranks-filter", "0,1", ["launcher.local_ranks_filter=[0,1]"]),
    ("--redirects", "3", ["launcher.redirects='3'"]), ("--logs-specs", "x", None),
    ("--numa-binding", "node", None), ("--signals-to-handle", "SIGUSR1", None),
    ("--event-log-handler", "console", None), ("--duplicate-stdout-filters", "a", None),
    ("--duplicate-stderr-filters", "a", None), ("--log-line-prefix-template", "x", None),
    ("--print-completion", "zsh", None),
])
def test_each_flag_in_each_spelling_maps_or_is_refused(flag, value, expected):
    for line in spellings(flag, value):
        if expected is None:
            with pytest.raises(ConfigError, match=flag):
                mapped(f"{line} train.py")
        elif flag in torchrun_flags.SHARED and "_" not in line:  # the launcher's own flag, with the same meaning
            assert mapped(f"{line} train.py") == [*line.split(), "train.py"]
        else:
            assert mapped(f"{line} train.py") == [*expected, "--", "train.py"], line


@pytest.mark.compat
def test_every_flag_of_this_torchs_torchrun_is_mapped_or_refused():
    """A torch release that gives torchrun a flag the table does not know fails here, on the torch that has it."""
    from torch.distributed.run import get_args_parser

    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", get_args_parser().format_usage())) - {"--help"}
    assert flags - (torchrun_flags.SWITCHES | torchrun_flags.VALUED) == set()


@pytest.mark.parametrize("line, expected", [
    ("--role trainer", ["launcher.role=trainer"]),
    ("-t 3", []), ("-t3", []), ("--tee 0:3,1:1", []),  # both streams of every rank are teed already
    ("-r 0:1,1:2", ["launcher.redirects='0:1,1:2'"]), ("-r3", ["launcher.redirects='3'"]),
    ("--event_log_handler null", []),
    ("--run-path", []), ("--run_path", []),  # the launcher runs the script in its worker's interpreter, always
])
def test_flags_that_ask_for_what_the_launcher_does_map_to_it(line, expected):
    assert mapped(f"{line} --nproc-per-node 2 train.py") == ["--gpus", "2", *expected, "--", "train.py"]


@pytest.mark.parametrize("value, host, workers", [
    ("cpu", HOST, 6), ("auto", HOST, 6), ("gpu", GPU_HOST, 4), ("auto", GPU_HOST, 4), ("7", GPU_HOST, 7)])
def test_nproc_per_node_counts_as_torchrun_does(value, host, workers):
    assert mapped(f"--nproc_per_node={value} train.py", host) == ["--gpus", str(workers), "--", "train.py"]


def test_documented_command_lines_become_the_launchers():
    p = "29512"
    assert mapped("--standalone --nnodes=1 --nproc-per-node=2 train.py --arg x") == [
        "--nodes", "1", "--gpus", "2", "--", "train.py", "--arg", "x"]
    assert mapped("--nproc_per_node 2 -m pkg.train --epochs 3") == ["--gpus", "2", "-m", "pkg.train", "--epochs", "3"]
    assert mapped("--module --nproc-per-node 2 pkg.train") == ["--gpus", "2", "-m", "pkg.train"]
    assert mapped(f"--nnodes 1 --node_rank 0 --master_addr 127.0.0.1 --master_port {p} --nproc_per_node 2 t.py") == [
        "--nodes", "1", "--gpus", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", p, "--", "t.py"]
    assert mapped(f"--nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint h0:{p} --rdzv-id job t.py") == [
        "--nodes", "2", "--gpus", "4", "--rdzv-endpoint", f"h0:{p}", "--rdzv-id", "job", "--", "t.py"]


def test_torchruns_rendezvous_defaults_apply_on_a_torchrun_line():
    # static is torchrun's default backend: node rank 0 at 127.0.0.1:29500 unless told otherwise
    assert mapped("--nnodes 2 --nproc-per-node 2 t.py")[4:-2] == [
        "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", "29500"]
    assert mapped("--nproc-per-node 2 --master-port 29600 t.py")[2:-2] == [
        "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", "29600"]
    assert mapped("--nnodes 2 --node-rank 1 --rdzv-endpoint h0:29400 --nproc-per-node 1 t.py")[4:-2] == [
        "--node-rank", "1", "--master-addr", "h0", "--master-port", "29400"]
    assert mapped("--nnodes 2 --nproc-per-node 1 --master-addr h0 --local-addr 10.0.0.2 t.py")[-3] == (
        "rdzv.local_addr=10.0.0.2")


def test_what_torchrun_ignores_is_named_on_stderr_not_dropped_silently():
    notes: List[str] = []
    out = launcher_argv("--standalone --rdzv-endpoint h:1 --nproc-per-node 2 t.py".split(), value_flags(), HOST,
                        notes.append)
    assert out == ["--gpus", "2", f"{RUN_ID}'FRESH'", "--", "t.py"] and notes == [
        "note: --standalone: --rdzv-endpoint ignored, as torchrun ignores it (one machine, a free port)"]


def test_the_launchers_own_command_lines_are_left_alone():
    for line in ("--gpus 2 --nodes 2 trainer.steps=3", "--gpus 2 -m pkg.train --lr 1",
                 "--nodes 2 --gpus 1 --rdzv-endpoint h0:29400 --rdzv-id j train.py --nproc_per_node 9",
                 "--nodes 2 --node-rank 0 --master-addr h0 --master-port 29500 train.py"):
        assert mapped(line) == line.split()


def test_a_mapped_line_parses_into_the_launchers_config_overrides():
    args, script = parse_args(mapped("--nproc_per_node 2 --role r --start-method spawn seed=3 t.py --x 1"))
    assert args.gpus == 2 and args.overrides == ["seed=3", "launcher.start_method=spawn", "launcher.role=r"]
    assert script == ["t.py", "--x", "1"]


@pytest.mark.parametrize("line, message", [
    ("--nnodes 2:1", "need 0 < MIN <= MAX"),
    ("--nproc-per-node gpu", "no CUDA device here"),
    ("--nproc-per-node xpu", "xpu"),
    ("--rdzv-backend etcd-v2 --rdzv-endpoint h:2379", "static or c10d"),
    ("--rdzv-backend c10d", "needs --rdzv-endpoint"),
    ("--rdzv-conf bogus=5", "not a rendezvous option here"),
    ("--standalone --nnodes 2", "--standalone is one machine"),
    ("--standalone --nnodes 1:2", "--nnodes 1:2 asks for up to 2"), ("--standalone --nodes 2", "--nodes 2 asks for up to 2"),
    ("--rdzv-backend c10d --rdzv-endpoint h0:0 --nnodes 1:2", "port 0 picks a free port, which the other nodes of --nnodes 1:2"),
    ("--nproc-per-node \u00b2", "the launcher takes a number"),  # isdigit() took it, int() does not
    ("--rdzv-conf read_timeout=-1", "read_timeout is seconds a store read may take"),
    ("--no-python", "--no-python"), ("--no_python", "--no-python"), ("--virtual-local-rank", "LOCAL_RANK"),
    ("--local-addr 10.0.0.2", "loopback only"),
    ("--start-method thread", "spawn, fork or forkserver"),
    ("--tee 5", "0-3"), ("-r 0:4", "0-3"), ("--local-ranks-filter a", "local ranks joined by commas"),
    ("--nproc-per-node 2 --gpus 2", "keep one"), ("--nnodes=1 --nodes=1", "keep one"),
    ("--rdzv-endpoint h0 --node_rank 1 --nnodes 2", "HOST:PORT"),
    ("--standalone=1", "takes no value"),
])
def test_what_cannot_mean_the_same_is_refused_in_one_line(line, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as refused:
        mapped(f"{line} t.py")
    assert "\n" not in str(refused.value)


def test_elastic_ranges_become_the_launchers_nodes_range():
    line = mapped("--nnodes 1:3 --rdzv-backend c10d --rdzv-endpoint h:29400 --rdzv-conf last_call_timeout=5 t.py")
    assert line[line.index("--nodes") + 1] == "1:3" and "rdzv.conf.last_call_timeout=5" in line
    args, _ = parse_args(line)
    assert args.nodes == "1:3"


def test_a_refused_flag_ends_the_launcher_with_one_line_exit_2_and_no_run_directory(tmp_path):
    runs = tmp_path / "runs"
    done = run_launcher(["--no-python", "--nproc-per-node", "2", f"output_dir={runs}", "t.py"], cwd=tmp_path,
                        timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("error: torchrun's --no-python has no counterpart here: ")
    assert not runs.exists()


# -- real runs: the same command line under torchrun and under `python -m launcher` -------------------------------

def both(workdir: Path, flags: List[str], target: List[str]) -> Tuple[List[tuple], subprocess.CompletedProcess]:
    """FLAGS TARGET --out DIR under torchrun and the launcher: per rank, (ours, torchrun's) environment, and how the
    launcher's run ended."""
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(SCRIPTS / "observer.py", workdir / "observer.py")
    ours_out, theirs_out = workdir / "ours", workdir / "theirs"
    ours_out.mkdir()
    theirs_out.mkdir()
    theirs = run_torchrun([*target, "--out", str(theirs_out)], workdir, COMMON_ENV, theirs_out, flags=flags)
    assert theirs.returncode == 0, theirs.stderr[-3000:]
    overrides = [f"output_dir={workdir / 'runs'}", "wandb.mode=disabled", "watchdog.timeout_s=0"]
    ours = run_launcher([*flags, *overrides, *target, "--out", str(ours_out)], cwd=workdir, timeout=RUN_TIMEOUT_S,
                        env=COMMON_ENV)
    assert ours.returncode == 0, ours.stderr[-3000:]
    seen = []
    for rank in range(2):
        pair = [json.loads((out / f"seen-{rank}.json").read_text()) for out in (ours_out, theirs_out)]
        argvs = [[a.replace(str(out), "OUT") for a in s["argv"]] for s, out in zip(pair, (ours_out, theirs_out))]
        assert argvs[0] == argvs[1]  # the script's own arguments, after the flags, reach it as under torchrun
        seen.append((pair[0]["env"], pair[1]["env"]))
    return seen, ours


# The standalone line of torchrun's docs (`--standalone --nnodes=1 --nproc-per-node=2 observer.py ARGS`) runs alike:
# tests/test_torchrun_fidelity.py's plain observer runs are that line under both, checked for the environment,
# the arguments and the interpreter (one pair of runs for both files' checks).


@pytest.mark.slow
def test_a_module_on_a_static_rendezvous_runs_alike_on_the_given_port(tmp_path):
    port = str(free_port())
    seen, _ = both(tmp_path, ["--nnodes", "1", "--node_rank", "0", "--master_addr", "127.0.0.1", "--master_port", port,
                           "--nproc_per_node", "2", "-m"], ["observer"])
    for ours, theirs in seen:
        assert ours["MASTER_PORT"] == theirs["MASTER_PORT"] == port
        assert ours["TORCHELASTIC_RUN_ID"] == theirs["TORCHELASTIC_RUN_ID"] == "none"  # static, no --rdzv-id
        assert env_differences(ours, theirs, watchdog=False) == {}


@pytest.mark.slow
def test_a_c10d_rendezvous_line_runs_alike_with_its_role_and_console_filter(tmp_path):
    """Also torchrun's documented "Fault tolerant" line (--nnodes=1, --max-restarts=3, --rdzv-id, c10d)."""
    flags = ["--nnodes=1", "--max-restarts=3", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{free_port()}",
             "--rdzv-id", "job", "--nproc-per-node", "2", "--role", "trainer", "--local-ranks-filter", "0", "-r", "0:2"]
    seen, run = both(tmp_path, flags, ["observer.py"])
    console = run.stdout + run.stderr  # local rank 1 not at all, rank 0's stderr kept in its log only
    assert "[rank0]: OUT-LINE" in console and "[rank0]: ERR-LINE" not in console and "[rank1]:" not in console
    logs = tmp_path / "runs" / "job-job" / "logs"
    texts = [(logs / f"rank-{k}.log").read_text() for k in range(2)]
    assert all("OUT-LINE" in text and "ERR-LINE" in text for text in texts)
    for ours, theirs in seen:
        assert ours["ROLE_NAME"] == theirs["ROLE_NAME"] == "trainer"
        assert ours["TORCHELASTIC_RUN_ID"] == theirs["TORCHELASTIC_RUN_ID"] == "job"
        assert ours["TORCHELASTIC_MAX_RESTARTS"] == theirs["TORCHELASTIC_MAX_RESTARTS"] == "3"
        assert env_differences({**ours, "ROLE_NAME": "default"}, {**theirs, "ROLE_NAME": "default"},
                               watchdog=False) == {}
