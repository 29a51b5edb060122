"""launcher.launch from a real Jupyter kernel (nbclient; docs/python-api.md): a DDP cell trains on 2 CPU ranks, a
failing rank's traceback shows the cell's lines, and the warm launcher a kernel keeps (launcher.api.standby) gives a
rank what a cold start gives it.

One kernel runs every launch (a module fixture): the first launch takes the launcher started when the kernel
imported launcher, the failing one the launcher prepared after the first, and the last starts cold because the
environment changed since its standby started. A standby nobody takes ends with its caller, or by itself.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time

import psutil
import pytest

TRAIN_CELL = (
    "import json, os\n"
    "import launcher\n\n"
    "def train(steps):\n"
    "    import os, random, stat, sys\n"
    "    import psutil\n"
    "    seen = {'modules': sorted(sys.modules), 'env': dict(os.environ), 'cwd': os.getcwd(),\n"
    "            'stdin': stat.S_IFMT(os.fstat(0).st_mode), 'random': random.random(),\n"
    "            'launcher': psutil.Process(os.getppid()).parent().cmdline()}  # the zygote's parent\n"
    "    import torch, torch.distributed as dist\n"
    "    from torch.nn.parallel import DistributedDataParallel as DDP\n"
    "    seen['seed'] = torch.initial_seed()\n"
    "    dist.init_process_group('gloo')\n"
    "    torch.manual_seed(0)\n"
    "    model = DDP(torch.nn.Linear(4, 1))\n"
    "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "    data = torch.Generator().manual_seed(dist.get_rank())\n"
    "    for _ in range(steps):\n"
    "        x = torch.randn(8, 4, generator=data)\n"
    "        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()\n"
    "        opt.zero_grad(); loss.backward(); opt.step()\n"
    "    weights = [round(w, 6) for w in model.module.weight.flatten().tolist()]\n"
    "    rank = dist.get_rank()\n"
    "    dist.destroy_process_group()\n"
    "    return {'rank': rank, 'loss': loss.item(), 'weights': weights, **seen}\n")
FAIL_CELL = (  # rank 1 raises two frames down, in a cell of its own; rank 0 returns at once
    "def check(value):\n"
    "    if int(os.environ['RANK']) == 1:\n"
    "        raise ValueError(f'rank 1 refused {value}')  # the line a traceback must show\n"
    "    return value\n\n"
    "def broken(value):\n"
    "    return check(value) + 1\n")
CHANGED = "LAUNCHER_TEST_CHANGED"  # set between launches: the standby no longer fits, the launch starts cold


@pytest.fixture(scope="module")
def notebook(tmp_path_factory):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    folder = tmp_path_factory.mktemp("notebook")
    settings = f"gpus=2, output_dir={str(folder / 'runs')!r}, wandb_mode='disabled'"
    run = f"results = launcher.launch(train, 3, {settings})\nprint('RESULTS ' + json.dumps(results))"
    fail = (f"try:\n    launcher.launch(broken, 41, {settings})\nexcept launcher.LaunchFailed as e:\n"
            f"    print('FAILED ' + json.dumps({{'rank': e.rank, 'traceback': e.traceback}}))")
    cold = (f"os.environ[{CHANGED!r}] = '1'\nresults = launcher.launch(train, 3, {settings})\n"
            "print('COLD ' + json.dumps(results))")
    cells = [nbformat.v4.new_code_cell(c) for c in (TRAIN_CELL, run, FAIL_CELL, fail, cold)]
    book = nbformat.v4.new_notebook(cells=cells)
    nbclient.NotebookClient(book, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    return book


def printed(notebook, cell: int, tag: str):
    text = "".join(o.get("text", "") for o in notebook.cells[cell].outputs if o.get("name") == "stdout")
    return json.loads(text.split(tag + " ", 1)[1].splitlines()[0])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_jupyter_cell_trains_a_ddp_model_on_two_ranks(notebook):
    results = printed(notebook, 1, "RESULTS")
    assert [r["rank"] for r in results] == [0, 1]
    assert results[0]["weights"] == results[1]["weights"]  # DDP kept the replicas equal
    assert results[0]["loss"] != results[1]["loss"]  # each rank its own data


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_failing_ranks_traceback_shows_the_cells_lines(notebook):
    failed = printed(notebook, 3, "FAILED")
    assert failed["rank"] == 1
    traceback = failed["traceback"]
    assert "<dynamic-code>" not in traceback
    assert "    return check(value) + 1\n" in traceback  # each frame's line, as IPython would show it
    assert "    raise ValueError(f'rank 1 refused {value}')  # the line a traceback must show\n" in traceback
    assert traceback.rstrip().endswith("ValueError: rank 1 refused 41")
    cell_file = re.findall(r'File "([^"]+)", line 3, in check', traceback)
    assert cell_file and cell_file[0].endswith(".py")  # the cell's own file name (ipykernel's), with its line number


def without_the_run(env: dict) -> dict:
    """A rank's environment with what names its own run (run id, ports, run directory) written as placeholders."""
    run_dir = env["TORCHELASTIC_ERROR_FILE"].split("/logs/")[0] if "TORCHELASTIC_ERROR_FILE" in env else "\0"
    found = {k: v.replace(run_dir, "RUN_DIR").replace(env["TORCHELASTIC_RUN_ID"], "RUN_ID") for k, v in env.items()}
    return {k: ("PORT" if k == "MASTER_PORT" else v) for k, v in found.items() if k != CHANGED}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_kernels_warm_launcher_gives_a_rank_what_a_cold_start_gives_it(notebook):
    warm, cold = printed(notebook, 1, "RESULTS"), printed(notebook, 4, "COLD")
    assert all("standby" in r["launcher"] for r in warm), warm[0]["launcher"]  # the launcher the kernel started ahead
    assert not any("standby" in r["launcher"] for r in cold), cold[0]["launcher"]  # the environment had changed
    assert cold[0]["env"][CHANGED] == "1" and CHANGED not in warm[0]["env"]  # ... and the cold start has it
    for w, c in zip(warm, cold):
        assert w["modules"] == c["modules"]  # sys.modules as the function starts
        assert without_the_run(w["env"]) == without_the_run(c["env"])
        assert w["cwd"] == c["cwd"] and w["stdin"] == c["stdin"] == stat.S_IFCHR  # /dev/null, as a cold start's
    for launch in (warm, cold):  # each rank its own generators, as fresh interpreters under torchrun
        assert launch[0]["seed"] != launch[1]["seed"] and launch[0]["random"] != launch[1]["random"]
    assert warm[0]["weights"] == cold[0]["weights"]  # the same training, the same weights


STANDBY = (  # a caller that starts a standby as a kernel would (launcher.api.standby), then waits
    "import sys, time\n"
    "from launcher.api import standby\n"
    "standby.IDLE_S = float(sys.argv[1])\n"
    "spare = standby.Standby()\n"
    "print(spare.process.pid, flush=True)\n"
    "time.sleep(120)\n")


def standby_of(tmp_path, idle_s: float):
    """(the caller, its standby's pid): a real caller process and the standby it started."""
    caller = subprocess.Popen([sys.executable, "-c", STANDBY, str(idle_s)], cwd=tmp_path, stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    return caller, int(caller.stdout.readline())


def gone(pid: int) -> bool:
    """Whether the process ended (a zombie its parent has not reaped yet counts as ended)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(120)
def test_an_unused_standby_ends_with_its_caller_or_after_its_idle_time(tmp_path):
    caller, pid = standby_of(tmp_path, 600)
    try:
        time.sleep(0.5)  # inside torch's import, or after it
        os.kill(caller.pid, signal.SIGKILL)
        psutil.Process(pid).wait(timeout=30)  # it dies with its caller, even one killed by SIGKILL (init reaps it)
    finally:
        caller.kill()
        caller.wait()
    caller, pid = standby_of(tmp_path, 1)
    try:
        deadline = time.monotonic() + 90
        while gone(pid) is False:  # nothing came within its idle time: it ends by itself
            assert time.monotonic() < deadline, "the idle standby still runs"
            time.sleep(0.2)
        assert caller.poll() is None  # its caller still runs
    finally:
        caller.kill()
        caller.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # and made nothing
