"""What launcher.backends.ray.code takes from Ray's private packaging code, pinned: the size of the folder a Ray job
ships is counted with Ray's own walk (ray._private.runtime_env.packaging._dir_travel and _get_excludes), so the
limit refuses what Ray would upload, and the links that walk meets are left out of what Ray's zip (_zip_files) holds.
A Ray release that changes them fails here first, not in a user's job.
"""

from __future__ import annotations

import zipfile

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[test]')")

from launcher.backends.ray.code import shipped_excludes, survey  # noqa: E402
from launcher.config.schema import load_config  # noqa: E402


def test_the_walk_counts_what_ray_ships_and_leaves_out_ignored_files(tmp_path):
    (tmp_path / "train.py").write_bytes(b"x" * 1000)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "model.py").write_bytes(b"y" * 500)
    (tmp_path / "data.bin").write_bytes(b"z" * 100_000)
    (tmp_path / ".gitignore").write_text("data.bin\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "big").write_bytes(b"v" * 50_000)
    size, _ = survey(tmp_path, [".venv"], stop_at=10**9)
    assert size == 1000 + 500 + len("data.bin\n"), size  # the .gitignore file itself ships; what it names does not


def test_the_walk_stops_at_the_limit(tmp_path):
    for k in range(20):
        (tmp_path / f"f{k}").write_bytes(b"a" * 1000)
    assert 2000 < survey(tmp_path, [], stop_at=2500)[0] <= 3000  # stopped once over the limit, not walked to the end


def test_symbolic_links_are_left_out_of_what_ray_zips_and_named(tmp_path):
    """Ray's zip follows links: a link to a file ships the file's bytes (a credentials file as well as a dataset),
    a link to a folder is walked, a link to "." until the path is too long. Each is left out by an exclude of its
    own, and Ray's own zip, given the job's excludes, holds none of what they point at."""
    from ray._private.runtime_env.packaging import _zip_files

    outside, code = tmp_path / "outside", tmp_path / "code"
    (outside / "dataset").mkdir(parents=True)
    (outside / "credentials").write_text("aws_secret_access_key = SECRET\n")
    (outside / "dataset" / "shard-0").write_bytes(b"d" * 50_000)
    (code / "pkg").mkdir(parents=True)
    (code / "train.py").write_bytes(b"t" * 300)
    (code / "pkg" / "model.py").write_bytes(b"m" * 200)
    (code / "pkg" / "creds").symlink_to(outside / "credentials")
    (code / "data").symlink_to(outside / "dataset")
    (code / "loop").symlink_to(".")
    (code / "we*ird [1]").symlink_to(outside / "credentials")
    (code / "weird 1").write_bytes(b"w" * 7)  # what an unescaped pattern "we*ird [1]" would wrongly leave out

    size, links = survey(code, [], stop_at=10**9)
    assert size == 300 + 200 + 7 and sorted(links) == ["data", "loop", "pkg/creds", "we*ird [1]"], (size, links)
    cfg = load_config(overrides=[f"output_dir={tmp_path / 'runs'}"])
    zipped = tmp_path / "code.zip"
    _zip_files(str(code), shipped_excludes(cfg, code), str(zipped), include_gitignore=True)
    with zipfile.ZipFile(zipped) as z:
        names = sorted(n for n in z.namelist() if not n.endswith("/"))
        contents = b"".join(z.read(n) for n in names)
    assert names == ["pkg/model.py", "train.py", "weird 1"], names
    assert b"SECRET" not in contents and b"d" * 100 not in contents
