"""`python -m launcher doctor`: verdicts with hints, a failing check fails the command, secrets stay
hidden, and `--comm` measures a real all-reduce across launched workers."""

import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers import launcher_env
from launcher.trainers.allreduce_bench import bus_factor, message_sizes

pytestmark = pytest.mark.timeout(120)

LINE = re.compile(r"^(ok|warn|FAIL)\s+(\S.*?)\s{2,}")


def doctor(tmp_path, *args, env=None, timeout=60):
    """Run doctor with HOME in tmp_path, so no real ~/.netrc or W&B login leaks in."""
    extra = {"HOME": str(tmp_path), **(env or {})}
    full_env = {k: v for k, v in launcher_env(extra).items() if k not in ("WANDB_API_KEY", "GLOO_SOCKET_IFNAME")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "launcher", "doctor", f"output_dir={tmp_path / 'runs'}", *args],
                          cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=timeout)


def verdicts(out):
    return {m[2]: m[1] for m in map(LINE.match, out.splitlines()) if m}


def test_healthy_machine_passes_and_names_every_check(tmp_path):
    result = doctor(tmp_path, env={"WANDB_API_KEY": "sk-very-secret-123", "SLURM_JOB_ID": "4242",
                                   "SLURM_JOB_NODELIST": "node[1-2]"})
    assert result.returncode == 0, result.stdout + result.stderr
    found = verdicts(result.stdout)
    for name in ("python", "torch", "gloo", "nccl", "gpus", "hostname", "interfaces", "ports", "slurm",
                 "slurm allocation", "wandb", "disk"):
        assert name in found, result.stdout
    assert "FAIL" not in found.values()
    assert "sk-very-secret-123" not in result.stdout + result.stderr  # the key's value never shows
    assert "WANDB_API_KEY is set" in result.stdout
    assert "inside job 4242 on node[1-2]" in result.stdout
    assert re.search(r"verdict: ok \(0 failed", result.stdout)


def test_failing_checks_fail_the_command_with_hints(tmp_path):
    result = doctor(tmp_path, "wandb.mode=online", env={"GLOO_SOCKET_IFNAME": "nosuch0"})
    assert result.returncode == 1, result.stdout
    found = verdicts(result.stdout)
    assert found["wandb"] == "ok" and found["gloo_socket_ifname"] == "FAIL", result.stdout
    lines = result.stdout.splitlines()
    key_line = next(i for i, line in enumerate(lines) if line.startswith("FAIL") and "online mode but no key" in line)
    assert "WANDB_API_KEY" in lines[key_line + 1] and "->" in lines[key_line + 1]  # the hint follows its check
    assert "no interface named nosuch0" in result.stdout
    assert re.search(r"verdict: FAIL \(2 failed", result.stdout)


@pytest.mark.skipif(shutil.which("sinfo") is None, reason="needs the SLURM client (sinfo)")
def test_unreachable_slurm_controller_is_a_warning_with_a_hint(tmp_path):
    conf = tmp_path / "slurm.conf"  # a real config whose controller is not running
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nSlurmctldPort=1\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    result = doctor(tmp_path, env={"SLURM_CONF": str(conf)})
    assert result.returncode == 0, result.stdout
    assert verdicts(result.stdout)["slurm partitions"] == "warn", result.stdout
    assert "is slurmctld running" in result.stdout and str(conf) in result.stdout


@pytest.mark.parametrize("args", [["--gpus", "two"], ["no.such.key=1"]])
def test_bad_doctor_arguments_are_one_line_errors(tmp_path, args):
    result = doctor(tmp_path, *args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr


def test_comm_measures_allreduce_bandwidth_through_the_launcher(tmp_path):
    result = doctor(tmp_path, "--comm", "--gpus", "2", "--max-bytes", "65536", timeout=110)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if re.match(r"^\s+\d+\s+\d+\s", line)]
    assert [int(r[0]) for r in rows] == [1024, 4096, 16384, 65536]
    for size, count, time_us, algbw, busbw in rows:
        assert int(count) == int(size) // 4 and float(time_us) > 0
        assert float(busbw) == pytest.approx(float(algbw), abs=1e-3)  # 2 ranks: busbw = algbw * 2(2-1)/2
    assert "2 ranks, gloo on cpu" in result.stdout
    assert "average bus bandwidth" in result.stdout
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("doctor-comm-")
    assert (runs[0] / "logs" / "rank-1.log").exists()  # a real two-worker launch


def test_bus_bandwidth_and_sizes_follow_nccl_tests():
    assert bus_factor(1) == 0.0 and bus_factor(2) == 1.0 and bus_factor(4) == 1.5 and bus_factor(8) == 1.75
    assert message_sizes(1024, 64 << 20, 4) == [1024 * 4**k for k in range(9)]
