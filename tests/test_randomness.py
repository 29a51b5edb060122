"""Every worker starts with its own random state, as each of torchrun's fresh interpreters does: torch's default
generator (torch.rand, dropout masks), Python's random and NumPy's global generator all differ between ranks, on
every start path (forked from the warm zygote, spawned, restarted, on several nodes). A script that seeds them
gets exactly what it gets under torchrun, bit for bit (and the same unnormalised __file__).
"""

from __future__ import annotations

import json
import shutil
import sys
from itertools import combinations
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from tests.helpers import NO_WANDB, REPO, run_bounded, run_launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = REPO / "tests" / "scripts" / "draws.py"
GENERATORS = ("initial_seed", "torch", "dropout", "random", "numpy")
ENV = {"OMP_NUM_THREADS": "1"}


def draws(out: Path, ranks: int, attempt: int = 0) -> List[dict]:
    return [json.loads((out / f"draws-{rank}-attempt-{attempt}.json").read_text()) for rank in range(ranks)]


def assert_all_differ(found: List[dict]) -> None:
    for key in GENERATORS:
        for a, b in combinations(range(len(found)), 2):
            assert found[a][key] != found[b][key], f"{key}: ranks {a} and {b} drew the same {found[a][key]}"


def ours(tmp_path: Path, launch: List[str], script_args: List[str] = (), expect: int = 0) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(SCRIPT, tmp_path / "draws.py")
    done = run_launcher([*launch, f"output_dir={tmp_path / 'runs'}", *NO_WANDB, "./draws.py", "--out", str(out),
                         *script_args],
                        cwd=tmp_path, timeout=200, env=ENV)
    assert done.returncode == expect, done.stderr[-3000:]
    return out


def torchrun(tmp_path: Path, nproc: int, script_args: List[str] = ()) -> Path:
    out = tmp_path / "torchrun-out"
    out.mkdir()
    shutil.copy(SCRIPT, tmp_path / "draws.py")
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "./draws.py",
            "--out", str(out), *script_args]
    done = run_bounded(argv, tmp_path, 200, ENV, "torchrun")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def forked_then_restarted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 workers forked from the zygote, rank 1 failing its first attempt: attempt 0 is the forked start path and
    attempt 1 the restarted one, so the two tests share this one launch."""
    return ours(tmp_path_factory.mktemp("forked"), ["--gpus", "4", "--max-restarts", "1"], ["--fail-rank", "1"])


# Each start path with its workers: a spawned worker is a fresh interpreter as torchrun's are (2 show it, and each
# one more costs ~3 CPU-s of imports); forked ones share the zygote's state, so 4 of them, on one node and on two.
START_PATHS: Dict[str, Tuple[List[str], int]] = {  # its launch, its ranks
    "forked from the zygote, 4 workers": ([], 4),  # forked_then_restarted's first attempt
    "spawned, 2 workers": (["--gpus", "2", "launcher.start_method=spawn"], 2),
    "two nodes of 2": (["--nodes", "2", "--gpus", "2"], 4),
}


@pytest.mark.parametrize("launch, ranks", START_PATHS.values(), ids=list(START_PATHS))
def test_every_rank_draws_its_own_numbers(request, tmp_path, launch, ranks):
    out = ours(tmp_path, launch) if launch else request.getfixturevalue("forked_then_restarted")
    assert_all_differ(draws(out, ranks))


def test_torchruns_workers_draw_their_own_numbers_too(tmp_path):
    """The baseline the launcher is held to: fresh interpreters (2: each one more costs ~3 CPU-s of imports)."""
    assert_all_differ(draws(torchrun(tmp_path, 2), 2))


def test_a_restarted_attempt_draws_afresh(forked_then_restarted):
    out = forked_then_restarted
    first, second = draws(out, 4, attempt=0), draws(out, 4, attempt=1)
    assert_all_differ(first + second)


def test_a_seeded_script_draws_exactly_what_it_draws_under_torchrun(tmp_path):
    mine = draws(ours(tmp_path, ["--gpus", "2"], ["--seed", "7"]), 2)
    theirs = draws(torchrun(tmp_path, 2, ["--seed", "7"]), 2)
    assert mine == theirs  # JSON floats carry every bit of a double; __file__ too
    assert mine[0]["file"] == f"{tmp_path}/./draws.py"
    assert mine[0]["initial_seed"] == 7 and mine[0] == mine[1]  # the same seed on every rank, as the script asked
