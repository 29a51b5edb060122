"""One torch import for the launcher and its zygote (launcher/prestart.py): which commands exec into
launcher/worker/bootstrap.py, and what a user could see of it: workers as before, nothing left behind,
no inherited file kept open, a Ctrl-C during the shared import ended in one line."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from launcher import prestart
from launcher.plan import no_gpu_here
from tests.helpers import NO_WANDB, QUIET, REPO, catches, communicate_bounded, group_processes, kill_group, \
    launcher_env, run_stamped, wait_gone

pytestmark = pytest.mark.timeout(240)

MODULES = """
import json, os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
fds = []
for fd in os.listdir("/proc/self/fd"):
    try:
        fds.append(os.readlink("/proc/self/fd/" + fd))
    except OSError:  # the listing's own
        pass
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "seen-%s-%s.json" % (sys.argv[1], os.environ["RANK"])), "w") as f:
    json.dump({"modules": sorted(sys.modules), "fds": sorted(fds)}, f)
dist.barrier()  # as scripts do: a rank that leaves straight after init can close its pair before its peer's is up
dist.destroy_process_group()
"""


def events(path):
    """tests/counting/sitecustomize.py's lines, as (pid, event) pairs."""
    return [tuple(line.split(" ", 1)) for line in path.read_text().splitlines()] if path.exists() else []


def counted(args, tmp_path, name, extra_env=None):
    """Run `python -m launcher ARGS` for real with tests/counting on PYTHONPATH: (its result, its own events). The
    result's `stamped` holds its output lines as they came (tests.helpers.run_stamped)."""
    calls = tmp_path / f"{name}.calls"
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests" / "counting"), os.environ.get("PYTHONPATH")])),
           "LAUNCHER_TEST_CALLS": str(calls), **(extra_env or {})}
    argv = [sys.executable, "-m", "launcher", *args]
    code, lines, pid = run_stamped(argv, tmp_path, 180, env=env)
    done = subprocess.CompletedProcess(argv, code, "".join(f"{line}\n" for _, s, line in lines if s == "out"),
                                       "".join(f"{line}\n" for _, s, line in lines if s == "err"))
    done.stamped = lines
    return done, [event for who, event in events(calls) if who == str(pid)]


def test_a_launch_resolves_its_config_once_plans_once_and_execs_once(tmp_path):
    """The real command, counted from outside the launcher's code (tests/counting/sitecustomize.py wraps the functions
    as they load, in every process of the launch): the config is resolved once and the plan built once, before and
    after the exec together (the exec'd process goes on from the handover), the process execs once and imports torch
    once (after the exec), and the run is the plan's: its run id and rendezvous endpoint. Its first line says what
    starts before torch's import (seconds under load), and only once."""
    (tmp_path / "t.py").write_text("")
    done, launcher = counted(["--gpus", "1", f"output_dir={tmp_path / 'runs'}", *NO_WANDB, "t.py"], tmp_path, "launch",
                             {"LAUNCHER_TEST_MARK_TORCH": "1"})
    assert done.returncode == 0, done.stderr
    # its first line comes before torch loads (the hook marks the import on the same stream), once: not again after
    err = [line for _, stream, line in done.stamped if stream == "err"]
    assert err[0].startswith("[launcher] starting 1 ") and err[0].endswith("; importing torch"), err[:3]
    assert err[1] == "[counting] import torch" and sum(line.startswith("[launcher] starting") for line in err) == 1, err
    expected = ["launcher.config.schema.load_config", "launcher.plan.build_plan", "exec", "import torch"]
    if not no_gpu_here():  # where a GPU may be, only torch can count them: the plan is built after the exec
        expected = ["launcher.config.schema.load_config", "exec", "import torch", "launcher.plan.build_plan"]
    assert launcher == expected, launcher
    (run,) = (tmp_path / "runs").iterdir()
    plan = json.loads((run / "plan.json").read_text())
    assert plan["run_id"] == run.name and f"run {run.name}:" in done.stderr, done.stderr


@pytest.mark.parametrize("args, kind", [
    ([], "trainer"),  # the built-in job on built-in defaults
    (["--gpus", "2", "t.py", "--lr", "1"], "script"),
    (["-m", "json.tool"], "script"),
    (["--config", "job.yaml"], "script"),  # the script named in a config file
    (["--nodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1"], "trainer"),  # one machine of several
    (["--nodes", "2"], None), (["--nodes=1:3"], None),  # a simulated job's coordinator starts no worker itself
    (["launcher.start_method=spawn", "t.py"], None),
])
def test_which_launches_fork_their_workers_from_a_zygote_here_and_of_what_kind(tmp_path, monkeypatch, args, kind):
    """launcher.backends.dispatch.workers_kind on the config the command line resolves to: a launch with a kind execs
    into the bootstrap (launcher.prestart) on its way; the others start no zygote here."""
    from launcher.backends.dispatch import workers_kind
    from launcher.run import resolve_config
    from launcher.usage import config_overrides, parse_args, script_spec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    (tmp_path / "job.yaml").write_text("script:\n  path: t.py\n")
    parsed, script = parse_args(args)
    assert workers_kind(resolve_config(parsed, config_overrides(parsed), script_spec(parsed, script))) == kind


@pytest.mark.parametrize("args", [
    ["--dry-run", "t.py"], ["--show-config"], ["--nodes", "2", "--dry-run"], ["ls"],
    ["--cluster", "slurm", "--dry-run", "t.py"],
])
def test_what_starts_no_worker_here_resolves_at_most_once_and_execs_never(tmp_path, args):
    (tmp_path / "t.py").write_text("")
    done, launcher = counted([*args, f"output_dir={tmp_path / 'runs'}"] if args != ["ls"] else ["ls", str(tmp_path)],
                                tmp_path, "none")
    assert done.returncode == 0, done.stderr
    assert launcher.count("launcher.config.schema.load_config") <= 1 and launcher.count("launcher.plan.build_plan") <= 1
    assert "exec" not in launcher and "import torch" not in launcher, launcher


@pytest.mark.parametrize("args, words", [
    (["model.hiden=64"], "unknown config key 'model.hiden'"),  # a config key
    (["output_dir=afile/runs"], "afile"),  # under a file: refused before torch loads
    pytest.param(["--gpus", "200", "t.py"], "CPU workers", marks=pytest.mark.skipif(  # more than this machine takes
        not no_gpu_here(), reason="where a GPU may be, the plan asks torch: the launch refuses it after the exec")),
    (["--nodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--rdzv-secret-file", "empty.secret"], "empty"),
])
def test_bad_input_ends_in_one_line_before_the_exec_and_torch(tmp_path, args, words):
    for name in ("t.py", "afile", "empty.secret"):
        (tmp_path / name).write_text("")
    done, launcher = counted(args, tmp_path, "bad")
    assert done.returncode == 2 and done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1, done.stderr
    assert words in done.stderr, done.stderr
    assert "exec" not in launcher and "import torch" not in launcher, launcher


def test_a_launch_forks_its_zygote_from_the_launcher_and_ends_it(tmp_path):
    """The launcher process is exec'd into the bootstrap (same pid), its zygote is its child with its command line,
    the workers are the zygote's children; when it exits, nothing of it is left."""
    (tmp_path / "wait.py").write_text("import time\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "--gpus", "2", f"output_dir={tmp_path / 'runs'}",
                             *NO_WANDB, "wait.py"], cwd=tmp_path, env=launcher_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        workers = []
        while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            try:  # a short-lived child (the `git` recording provenance) can go between two reads
                workers = [p for c in psutil.Process(proc.pid).children() if c.cmdline() == psutil.Process(proc.pid).cmdline()
                           for p in c.children()]
            except psutil.Error:
                continue
        launcher = psutil.Process(proc.pid).cmdline()
        assert launcher[1:5] == ["-u", prestart.BOOTSTRAP, "script", prestart.HANDOVER], launcher
        assert launcher[6:8] == ["-m", "launcher"], launcher
        assert len(workers) == 2, "the workers are the children of the launcher's child with its command line"
        os.kill(proc.pid, signal.SIGTERM)
        out, err = communicate_bounded(proc, 60)
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert group_processes(proc.pid) == [], "the launcher's exit left its zygote or a worker running"
    finally:
        kill_group(proc)


def test_a_scripts_workers_hold_the_same_modules_however_the_script_is_named(tmp_path):
    """Named on the command line or in a config file, the script's workers hold exactly the same modules (the zygote
    forked at the start imports for the kind the config names). No worker holds a file the launcher got from its
    parent (one kept open here, as a caller's pipe)."""
    (tmp_path / "modules.py").write_text(MODULES)
    (tmp_path / "job.yaml").write_text("script:\n  path: modules.py\n  args: [config]\n")
    read_end, write_end = os.pipe()
    try:
        inherited = os.readlink(f"/proc/self/fd/{write_end}")
        for argv in (["modules.py", "cli"], ["--config", str(tmp_path / "job.yaml")]):
            proc = subprocess.Popen([sys.executable, "-m", "launcher", "--gpus", "2", f"output_dir={tmp_path / 'runs'}",
                                     *NO_WANDB, *argv], cwd=tmp_path, env=launcher_env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True, pass_fds=(write_end,))
            err = communicate_bounded(proc, 180)[1]
            assert proc.returncode == 0, err
    finally:
        os.close(read_end)
        os.close(write_end)
    seen = {(how, rank): json.loads((tmp_path / f"seen-{how}-{rank}.json").read_text())
            for how in ("cli", "config") for rank in (0, 1)}
    assert seen["cli", 0]["modules"] == seen["config", 0]["modules"] == seen["config", 1]["modules"]
    assert not [m for m in seen["config", 0]["modules"] if m.startswith(("launcher", "torch._dynamo"))]
    assert all(inherited not in s["fds"] for s in seen.values()), "a worker holds the launcher's caller's pipe"


def test_a_bad_value_leaves_no_zygote_behind(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "--gpus", "2", f"output_dir={tmp_path / 'runs'}",
                             "model.hiden=64"], cwd=tmp_path, env=launcher_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = communicate_bounded(proc, 60)
        assert proc.returncode == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, err
        assert group_processes(proc.pid) == [], "the zygote forked at the start outlived the refusal"
        assert not (tmp_path / "runs").exists()
    finally:
        kill_group(proc)


def test_a_ctrl_c_during_the_shared_import_ends_the_launch_in_one_line(tmp_path):
    """Between the exec and the launcher's first line the stop signals are held: the Ctrl-C comes through once the
    launcher can take it, as one line and exit 130, no traceback, nothing on disk, its zygote gone with it."""
    proc = subprocess.Popen([sys.executable, "-m", "launcher", f"output_dir={tmp_path / 'runs'}", *QUIET],
                            cwd=tmp_path, env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if prestart.BOOTSTRAP in psutil.Process(proc.pid).cmdline():
                    break
            except psutil.Error:
                pass
            time.sleep(0.005)
        assert not catches(proc.pid, signal.SIGHUP), "the launcher's own first line ran already: no window to test"
        os.kill(proc.pid, signal.SIGINT)
        out, err = communicate_bounded(proc, 60)
        assert proc.returncode == 130, err
        # after the launch's first line (launcher.backends.dispatch.announce, before the exec): one line
        assert err.splitlines()[-1] == "interrupted" and len(err.splitlines()) == 2 and "Traceback" not in out + err, err
        assert err.startswith("[launcher] starting "), err
        assert not (tmp_path / "runs").exists()
        assert wait_gone(group_processes(proc.pid), 5) == [], "its zygote outlived it"
    finally:
        kill_group(proc)


def test_the_launcher_command_starts_the_same_way(tmp_path):
    """The `launcher` console script (setup.cfg) execs too: a worker's parent, the zygote, has its command line."""
    command = os.path.join(os.path.dirname(sys.executable), "launcher")
    if not os.path.exists(command):
        pytest.skip("the package is not installed with its console script here (tests/run.sh installs it)")
    (tmp_path / "parent.py").write_text("import os\nopen('parent-%s' % os.environ['RANK'], 'wb').write("
                                        "open('/proc/%d/cmdline' % os.getppid(), 'rb').read())\n")
    run = subprocess.run([command, "--gpus", "1", f"output_dir={tmp_path / 'runs'}", *NO_WANDB, "parent.py"],
                         cwd=tmp_path, env=launcher_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    seen = (tmp_path / "parent-0").read_bytes().split(b"\0")
    assert seen[2:5] == [prestart.BOOTSTRAP.encode(), b"script", prestart.HANDOVER.encode()], seen
    assert seen[6:8] == [b"--path", command.encode()], seen
    bad = subprocess.run([command, "--gpus", "x"], cwd=tmp_path, env=launcher_env(), capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr, bad.stderr


def test_a_zygote_forked_for_another_kind_is_not_taken_and_is_killed():
    """The config changed between the check and the launch (a file edited in between): the zygote that imported for
    the other kind is killed and reaped, and the agent starts a fresh one (None)."""
    import socket

    child = subprocess.Popen(["sleep", "30"])
    ours, theirs = socket.socketpair()
    prestart._State.zygote = (child.pid, ours.detach(), "trainer")
    try:
        assert prestart.take("script") is None
        assert prestart._State.zygote is None
        with pytest.raises(ChildProcessError):  # reaped already
            os.waitpid(child.pid, os.WNOHANG)
    finally:
        prestart._State.zygote = None
        theirs.close()
        if child.returncode is None and psutil.pid_exists(child.pid):
            child.kill()
