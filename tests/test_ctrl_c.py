"""Ctrl-C to a plain script's whole process group never shows a launcher frame, at any moment of the job.

A few rounds of bench/ctrl_c.py (tests/ctrl_c_rounds.py): SIGINT to the launcher's process group, as a
terminal sends it, while rank 0 is in init_process_group, as it finishes its script (the agent's SIGINT
follows the terminal's into the worker's exit), and once summary.json is written (the launcher's exit).
Each ends with the launcher's one `interrupted` line and exit 130, or completed when the job had finished;
a script's own KeyboardInterrupt traceback is the script's, as under torchrun.
"""

import random
import subprocess
import sys
import textwrap

import pytest

from tests.ctrl_c_rounds import LAUNCHER_FRAME, one_round
from tests.helpers import NO_WANDB, communicate_bounded, launcher_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


# Steps of the script per phase: "end" and "exit" come after its last step, so a short script reaches them as well
# (and leaves less training and polling to wait through); "init" keeps the long one, so the job is still in it.
STEPS = {"init": 150, "end": 20, "exit": 20}


@pytest.mark.parametrize("phase", ["init", "end", "exit"])
def test_ctrl_c_to_the_group_shows_no_launcher_frame(tmp_path, phase):
    result = one_round(tmp_path, phase, random.Random(phase), steps=STEPS[phase])
    assert result.verdict == "clean", f"{phase}, SIGINT {result.delay_s:.3f}s in: {result.verdict}\n{result.output}"


# The script ends in KeyboardInterrupt and prints its traceback with a slow excepthook (rich's takes a while):
# a second SIGINT, as the agent's that follows a terminal's Ctrl-C, comes while the worker prints it.
SECOND_SIGINT_WHILE_PRINTING = textwrap.dedent("""
    import os, signal, sys, threading, time

    def slow_hook(kind, value, tb):
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        time.sleep(1.0)
        sys.__excepthook__(kind, value, tb)

    sys.excepthook = slow_hook
    print("script done", flush=True)
    raise KeyboardInterrupt
""")


def test_a_second_sigint_while_the_scripts_traceback_is_printed_shows_no_launcher_frame(tmp_path):
    (tmp_path / "hook.py").write_text(SECOND_SIGINT_WHILE_PRINTING)
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "--gpus", "1", f"output_dir={tmp_path / 'runs'}",
                             *NO_WANDB, str(tmp_path / "hook.py")], cwd=tmp_path, env=launcher_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    out, _ = communicate_bounded(proc, 120, "launcher")
    assert "[rank0]: script done" in out and "[rank0]:     raise KeyboardInterrupt" in out, out  # the script's own
    assert not LAUNCHER_FRAME.search(out) and "During handling" not in out, out


def run_python(tmp_path, code):
    """python -c CODE in its own session, to its end (60 s at most): the process and its output."""
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=launcher_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    out, _ = communicate_bounded(proc, 60, "python")
    return proc, out


# After the agent: a signal is recorded (torch's handler, left behind, raised it anywhere), raised once the
# command has its exit code, and one after that is dropped (the launcher's exit only waits for its zygote).
AFTER_THE_AGENT = textwrap.dedent("""
    import os, signal
    from launcher import interrupts
    from launcher.errors import Interrupted

    def torch_like(signum, frame):
        raise RuntimeError("a handler left behind")

    signal.signal(signal.SIGINT, torch_like)
    interrupts.recording()
    os.kill(os.getpid(), signal.SIGINT)  # recorded, not raised
    print("recorded", flush=True)
    try:
        interrupts.conclude()
    except Interrupted as e:
        print("raised at the end:", e.sigval, flush=True)
    os.kill(os.getpid(), signal.SIGINT)  # dropped
    os.kill(os.getpid(), signal.SIGTERM)
    print("dropped", flush=True)
""")


def test_a_signal_after_the_agent_is_recorded_then_raised_once_then_dropped(tmp_path):
    proc, out = run_python(tmp_path, AFTER_THE_AGENT)
    assert proc.returncode == 0 and out.splitlines() == ["recorded", "raised at the end: 2", "dropped"], out


# A completed run: a signal recorded after the agent is named and dropped (the summary says "completed", so the
# exit is 0), and one during the interpreter's teardown, when Python has put its handlers back to the default,
# does not end the launcher with -15 either.
AFTER_A_COMPLETED_RUN = textwrap.dedent("""
    import os, signal, time
    from launcher import interrupts

    class InTheTeardown:
        # module teardown, after the interpreter reset its signal handlers; what it calls is bound here,
        # since the module's own names may be cleared before this object is
        def __del__(self, kill=os.kill, pid=os.getpid(), sig=signal.SIGTERM, sleep=time.sleep, write=os.write):
            kill(pid, sig)
            sleep(0.2)
            write(1, b"survived the teardown\\n")

    late = InTheTeardown()
    interrupts.hold()
    interrupts.release()
    interrupts.recording()
    os.kill(os.getpid(), signal.SIGTERM)  # recorded, as the summary is written
    print("settled with", interrupts.settled(), flush=True)
    interrupts.conclude()  # nothing left to raise
    os.kill(os.getpid(), signal.SIGINT)  # dropped
    print("concluded", flush=True)
""")


def test_a_signal_as_a_completed_run_ends_changes_nothing_through_the_interpreters_teardown(tmp_path):
    proc, out = run_python(tmp_path, AFTER_A_COMPLETED_RUN)
    assert proc.returncode == 0, (proc.returncode, out)
    assert out.splitlines() == ["settled with 15", "concluded", "survived the teardown"], out


# The launcher process's end (interrupts.end): its threads are joined and its atexit handlers run, what it wrote
# to a pipe without flushing arrives, and the exit code is main's, as with sys.exit; the interpreter's teardown
# (a __del__ at module clearing stands for it here) is skipped.
THE_END = textwrap.dedent("""
    import atexit, os, sys, threading, time
    from launcher import interrupts

    class InTheTeardown:
        def __del__(self, write=os.write):  # bound here: the module's names may be cleared first
            write(1, b"teardown ran\\n")

    late = InTheTeardown()
    interrupts.hold()
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread joined"))).start()
    atexit.register(print, "atexit ran")  # buffered: stdout is a pipe
    print("main done")
    interrupts.end(3)
""")


def test_the_launchers_end_keeps_its_exit_code_atexit_handlers_threads_and_output(tmp_path):
    proc, out = run_python(tmp_path, THE_END)
    assert proc.returncode == 3, (proc.returncode, out)
    assert out.splitlines() == ["main done", "thread joined", "atexit ran"], out
