"""NCCL's flight recorder in a hung NCCL job: skipped without CUDA (docs/hangs.md)."""


import pytest
import torch

from tests.helpers import finish_all, only_run_dir, read_summary, start_launcher

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"),
]

SCRIPT = """
import os, time
import torch, torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
print("recorder", os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE"), flush=True)
p = torch.nn.Parameter(torch.ones(4, device="cuda"))
opt = torch.optim.SGD([p], lr=0.1)
for step in range(1, 100000):
    if rank == 0 and step == 20:
        time.sleep(3600)
    t = torch.ones(1, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    p.grad = torch.ones_like(p)
    opt.step()
"""


def test_a_hung_nccl_job_has_the_flight_recorder_on_and_is_named(tmp_path):
    gpus = min(2, torch.cuda.device_count())
    (tmp_path / "nccl_hang.py").write_text(SCRIPT)
    proc = start_launcher(["--gpus", str(gpus), f"output_dir={tmp_path / 'runs'}", "watchdog.timeout_s=5",
                           "nccl_hang.py"], tmp_path)
    out, = finish_all([proc], timeout=150)
    assert "recorder 2000" in out, out  # every rank got the flight recorder
    if gpus < 2:
        return  # one rank cannot hang in a collective on its own; the variable is what is checked
    assert proc.returncode == 1, out
    run_dir = only_run_dir(tmp_path / "runs")
    error = read_summary(run_dir)["error"]
    assert "rank 0 stuck" in error, error
    assert "rank 0 never joined all_reduce #" in error and "(NCCL flight recorder)" in error, error
    assert (run_dir / "stacks" / "rank-1.txt").read_text()
