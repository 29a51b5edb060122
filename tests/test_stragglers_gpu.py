"""On a GPU, the slow rank of a DDP script is named from DDP's CUDA-event clock of each iteration, as on CPU from its
host clock (tests/test_stragglers.py): skipped without CUDA."""

import re

import pytest
import torch

from tests.test_stragglers import launch
from tests.helpers import read_summary

pytestmark = [
    pytest.mark.gpu, pytest.mark.slow, pytest.mark.timeout(300),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"),
]


def test_a_sleeping_rank_on_a_gpu_is_named_by_what_it_computes(tmp_path):
    run_dir, rows, err = launch(tmp_path, "gpus-4", "sleep", 150)  # 4 ranks: one GPU each where there are 4
    summary = read_summary(run_dir)
    assert summary["straggler_rank"] == 3, {k: summary.get(k) for k in ("compute_s_per_rank", "wait_s_per_rank")}
    assert re.fullmatch(r"rank 3 \(node 0\) computes \d+\.\dx longer than the median rank", summary["straggler"])
    assert [r["step"] for r in rows if r.get("straggler_rank") == 3][0] <= 50
