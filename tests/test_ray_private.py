"""What launcher.backends.ray.code takes from Ray's private packaging code, pinned: the size of the folder a Ray job
ships is counted with Ray's own walk (ray._private.runtime_env.packaging._dir_travel and _get_excludes), so the
limit refuses what Ray would upload. A Ray release that changes them fails here first, not in a user's job.
"""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[test]')")

from launcher.backends.ray.code import shipped_bytes  # noqa: E402


def test_the_walk_counts_what_ray_ships_and_leaves_out_ignored_files(tmp_path):
    (tmp_path / "train.py").write_bytes(b"x" * 1000)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "model.py").write_bytes(b"y" * 500)
    (tmp_path / "data.bin").write_bytes(b"z" * 100_000)
    (tmp_path / ".gitignore").write_text("data.bin\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "big").write_bytes(b"v" * 50_000)
    size = shipped_bytes(tmp_path, [".venv"], stop_at=10**9)
    assert size == 1000 + 500 + len("data.bin\n"), size  # the .gitignore file itself ships; what it names does not


def test_the_walk_stops_at_the_limit(tmp_path):
    for k in range(20):
        (tmp_path / f"f{k}").write_bytes(b"a" * 1000)
    assert 2000 < shipped_bytes(tmp_path, [], stop_at=2500) <= 3000  # stopped once over the limit, not walked to the end
