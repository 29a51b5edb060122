"""Multi-node planning (pure): which mode a command line asks for and the rendezvous every node derives."""

import pytest

from launcher.usage import config_overrides, parse_args
from launcher.config.schema import load_config
from launcher.errors import ConfigError
from launcher.config.rendezvous import launch_mode, rdzv_configs, shared_run_id
from launcher.plan import Hardware, build_plan

CPU = Hardware(cuda_devices=0, cpu_cores=2)


def cfg_for(argv):
    args, _ = parse_args(argv)
    return load_config(None, config_overrides(args))


def plan_for(argv, free_port=0):
    cfg = cfg_for(argv)
    run_id = shared_run_id(cfg) or "fresh-id"
    return build_plan(cfg, CPU, run_id, f"/tmp/runs/{run_id}", free_port)


@pytest.mark.parametrize("argv, mode", [
    (["--gpus", "2"], "single"),
    (["--nodes", "2", "--gpus", "2"], "simulated"),
    (["--nodes", "2", "--node-rank", "1", "--master-addr", "h0"], "static"),
    (["--nodes", "2", "--rdzv-endpoint", "h0:29400"], "c10d"),
])
def test_the_flags_choose_the_mode(argv, mode):
    assert launch_mode(cfg_for(argv)) == mode


def test_simulated_nodes_meet_on_the_free_port_under_a_fresh_run_id():
    plan = plan_for(["--nodes", "2", "--gpus", "2"], free_port=41234)
    assert (plan.mode, plan.rdzv_backend, plan.rdzv_endpoint) == ("simulated", "static", "127.0.0.1:41234")
    assert plan.rdzv_id == plan.run_id == "fresh-id" and plan.world_size == 4


def test_every_static_node_derives_the_same_run_id_from_the_address():
    plans = [plan_for(["--nodes", "2", "--node-rank", str(k), "--master-addr", "10.0.0.5", "--master-port", "29501"])
             for k in (0, 1)]
    assert {p.run_id for p in plans} == {"job-10.0.0.5-29501"}
    assert [p.node_rank for p in plans] == [0, 1]
    assert rdzv_configs(plans[1]) == {"join_timeout": 60, "rank": 1, "timeout": 60}


def test_a_one_node_job_on_a_fixed_port_is_a_new_run_each_time_as_under_torchrun():
    """`torchrun --nproc-per-node 2 --master-port 29501 train.py` run again was refused as a second launch on the
    first one's run id (job-127.0.0.1-29501): only nodes that must find each other's directory derive one."""
    for argv in (["--master-port", "29501"], ["--nodes", "1", "--rdzv-endpoint", "127.0.0.1:29400"]):
        assert plan_for([*argv, "--gpus", "2"]).run_id == "fresh-id"


def test_c10d_run_id_comes_from_rdzv_id_when_given():
    plan = plan_for(["--nodes", "2", "--rdzv-endpoint", "head.example:29400", "--rdzv-id", "exp 7/a"])
    assert (plan.rdzv_backend, plan.rdzv_endpoint) == ("c10d", "head.example:29400")
    assert plan.run_id == "job-exp_7_a" and plan.rdzv_id == "exp_7_a"
    assert plan_for(["--nodes", "2", "--rdzv-endpoint", "head:29400"]).run_id == "job-head-29400"
    assert "rank" not in rdzv_configs(plan)  # c10d hands out node ranks on arrival


@pytest.mark.parametrize("argv, words", [
    (["--nodes", "2", "--rdzv-endpoint", "h:1", "--node-rank", "0", "--master-addr", "h"], "two kinds of rendezvous"),
    (["--nodes", "2", "--master-addr", "h"], "needs --node-rank K"),
    (["--nodes", "2", "--node-rank", "0", "--master-addr", "h", "--master-port", "0"], "outside 1..65535"),
    (["--nodes", "2", "--rdzv-endpoint", "h:99999"], "outside 1..65535"),
])
def test_contradictions_are_config_errors(argv, words):
    with pytest.raises(ConfigError, match=words):
        cfg_for(argv)


def test_help_says_c10d_admits_different_worker_counts():
    from launcher.usage import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "nodes may run different worker counts" in text
    for flag in ("--node-rank", "--master-addr", "--master-port", "--rdzv-endpoint", "--rdzv-id", "--rdzv-timeout"):
        assert flag in text


def test_simulated_nodes_meet_on_a_free_port_below_the_ephemeral_range():
    """Not one the kernel also hands to outgoing connections (another job's gloo took one before node 0 bound it)."""
    import socket

    from launcher.backends.addresses import BELOW_EPHEMERAL, ephemeral_low, free_port

    low = ephemeral_low()
    ports = [free_port() for _ in range(20)]
    assert all(low - BELOW_EPHEMERAL <= port < low for port in ports) and len(set(ports)) > 1, (low, ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # free when handed out
