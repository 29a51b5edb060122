"""Launch-plan building (pure: hardware is passed in) and argument splitting."""

import pytest

from launcher.usage import build_parser, split_argv
from launcher.config.schema import load_config
from launcher.errors import ConfigError
from launcher.plan import Hardware, build_plan

CPU = Hardware(cuda_devices=0, cpu_cores=2)


def plan_for(overrides, hw=CPU):
    return build_plan(load_config(None, overrides), hw, "rid", "/tmp/runs/rid")


def test_cpu_box_runs_gloo_workers_and_says_so():
    plan = plan_for(["gpus=2"])
    assert (plan.device_type, plan.backend, plan.world_size) == ("cpu", "gloo", 2)
    assert "no CUDA device: running 2 CPU workers with gloo" in plan.notices


def test_the_worker_count_announced_is_the_jobs_with_the_count_per_node():
    # a 2-worker job said "running 1 CPU worker" (its count per node)
    simulated = plan_for(["nodes=2", "gpus=1"])
    assert "no CUDA device: running 2 CPU workers (2 nodes x 1) with gloo" in simulated.notices
    one_of_two_machines = plan_for(["nodes=2", "gpus=2", "rdzv.node_rank=1", "rdzv.master_addr=10.0.0.1"])
    assert "no CUDA device: running 4 CPU workers (2 nodes x 2) with gloo" in one_of_two_machines.notices
    # the simulated nodes share this machine's cores; one machine of two has its own
    assert any("(2 cores / 4 workers on this machine)" in n for n in plan_for(["nodes=2", "gpus=2"], Hardware(0, 2)).notices)
    assert any("(2 cores / 2 workers on this machine)" in n for n in one_of_two_machines.notices)


def test_cuda_box_uses_nccl_and_refuses_more_gpus_than_visible():
    plan = plan_for(["gpus=2"], Hardware(cuda_devices=4, cpu_cores=16))
    assert (plan.device_type, plan.backend) == ("cuda", "nccl") and not any("CPU" in n for n in plan.notices)
    with pytest.raises(ConfigError, match="--gpus 8 but CUDA shows 4"):
        plan_for(["gpus=8"], Hardware(cuda_devices=4, cpu_cores=16))


def test_threads_share_the_cores_unless_the_user_exported_them():
    assert plan_for(["gpus=2"]).worker_env["OMP_NUM_THREADS"] == "1"
    assert plan_for(["gpus=4"]).omp_threads == 1
    assert plan_for(["gpus=1"]).omp_threads == 2
    assert plan_for(["gpus=2"], Hardware(0, 16)).omp_threads == 8
    assert any("OMP_NUM_THREADS=8 per worker" in n for n in plan_for(["gpus=2"], Hardware(0, 16)).notices)
    exported = plan_for(["gpus=2"], Hardware(0, 16, omp_threads_env=3))  # torchrun keeps an exported value
    assert exported.omp_threads == 3 and "OMP_NUM_THREADS" not in exported.worker_env
    assert not any("OMP_NUM_THREADS" in n for n in exported.notices)
    assert plan_for(["gpus=2", "launcher.omp_threads=5"], Hardware(0, 16, omp_threads_env=3)).worker_env["OMP_NUM_THREADS"] == "5"


def test_workers_fork_from_the_zygote_unless_spawn_is_asked_for():
    assert plan_for([]).start_method == "fork" and "zygote" in plan_for([]).start_method_reason
    assert plan_for(["launcher.start_method=spawn"]).start_method == "spawn"


def test_a_script_sees_launcher_variables_only_while_the_watchdog_is_on(tmp_path):
    (tmp_path / "train.py").write_text("")
    script = [f"script.path={tmp_path / 'train.py'}"]
    assert set(plan_for(script).worker_env) == {"LAUNCHER_RUN_DIR", "LAUNCHER_WATCHDOG_TIMEOUT_S"}
    assert set(plan_for([*script, "watchdog.timeout_s=0"]).worker_env) == set()
    assert set(plan_for([*script, "gpus=2", "watchdog.timeout_s=0"]).worker_env) == {"OMP_NUM_THREADS"}
    assert set(plan_for([*script, "gpus=2", "watchdog.timeout_s=0"], Hardware(0, 2, omp_threads_env=2)).worker_env) == set()


def test_a_script_gets_torchruns_threads_and_the_built_in_trainer_shares_the_cores(tmp_path):
    """torchrun sets OMP_NUM_THREADS=1 only with several workers per node and none exported; never with one."""
    (tmp_path / "train.py").write_text("")
    script = [f"script.path={tmp_path / 'train.py'}"]
    many = Hardware(0, 16)
    assert plan_for([*script, "gpus=4"], many).worker_env["OMP_NUM_THREADS"] == "1"
    assert any("as torchrun sets it" in n for n in plan_for([*script, "gpus=4"], many).notices)
    for one in ([*script], [*script, "nodes=2"]):  # one per node, simulated nodes too: unset, as under torchrun
        plan = plan_for(one, many)
        assert "OMP_NUM_THREADS" not in plan.worker_env and plan.omp_threads == 0
        assert not any("OMP_NUM_THREADS" in n for n in plan.notices)
    odd = Hardware(0, 16, exported=("OMP_NUM_THREADS",))  # exported, even unreadable: passed on as it is
    assert "OMP_NUM_THREADS" not in plan_for([*script, "gpus=4"], odd).worker_env
    assert plan_for([*script, "gpus=4", "launcher.omp_threads=3"], many).worker_env["OMP_NUM_THREADS"] == "3"
    assert plan_for(["gpus=1"], many).worker_env["OMP_NUM_THREADS"] == "16"  # the trainer: cores / workers


def test_an_elastic_job_states_its_range_and_the_nodes_it_starts_with():
    c10d = plan_for(["nodes=4", "min_nodes=1", "gpus=2", "rdzv.endpoint=h0:29400"])
    assert "no CUDA device: running 2 CPU workers (1 node x 2; elastic 1:4 nodes) with gloo" in c10d.notices
    simulated = plan_for(["nodes=2", "min_nodes=1", "gpus=2"])  # every node of the range runs here
    assert "no CUDA device: running 4 CPU workers (2 nodes x 2; elastic 1:2 nodes) with gloo" in simulated.notices
    from launcher.config.elastic import round_line
    from launcher.plan import starting_workers

    assert starting_workers(c10d) == "2 workers (1 node x 2; elastic 1:4 nodes)"
    assert round_line(3, ["h0:11", "h1:12"], 4, 1, 4) == "elastic round 3: running 4 workers on 2 nodes (--nodes 1:4)"


@pytest.mark.parametrize("argv, ours, script", [
    (["--gpus", "2"], ["--gpus", "2"], []),
    (["--gpus", "2", "train.py", "--lr", "0.1"], ["--gpus", "2"], ["train.py", "--lr", "0.1"]),
    (["seed=1", "train.py", "seed=2"], ["seed=1"], ["train.py", "seed=2"]),
    (["--nodes", "1", "-m", "pkg.mod", "--x"], ["--nodes", "1", "-m", "pkg.mod"], ["--x"]),
    (["--config", "quick", "trainer.steps=3"], ["--config", "quick", "trainer.steps=3"], []),
    (["--gpus", "1", "--", "run.py"], ["--gpus", "1"], ["run.py"]),
])
def test_split_argv(argv, ours, script):
    assert split_argv(argv, build_parser()) == (ours, script)


def test_nccl_jobs_get_the_flight_recorder_while_the_watchdog_is_on():
    gpu = Hardware(cuda_devices=2, cpu_cores=16)
    env = plan_for(["gpus=2"], gpu).worker_env
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/tmp/runs/rid/stacks/nccl-trace-rank-"
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/tmp/runs/rid/stacks/nccl-pipe-rank-"
    assert not any(k.startswith("TORCH_NCCL") for k in plan_for(["gpus=2", "watchdog.timeout_s=0"], gpu).worker_env)
    assert not any(k.startswith("TORCH_NCCL") for k in plan_for(["gpus=2"]).worker_env)  # gloo: no recorder
    mine = Hardware(cuda_devices=2, cpu_cores=16, exported=("TORCH_NCCL_TRACE_BUFFER_SIZE",))
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in plan_for(["gpus=2"], mine).worker_env  # the user's value stands


def test_watchdog_start_timeout_is_validated_with_the_fix():
    with pytest.raises(ConfigError, match=r"watchdog.start_timeout_s=-5 must be positive .*watchdog.start_timeout_s=600"):
        load_config(None, ["watchdog.start_timeout_s=-5"])
    assert load_config(None, []).watchdog.start_timeout_s == 600
