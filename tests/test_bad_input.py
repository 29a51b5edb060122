"""Bad input: one line naming the problem and the fix, exit code 2, no traceback, nothing started,
nothing created or changed (no run directory, no `./~`, a resumed run's files untouched).

The documentation's "Bad input" section (docs/configuration.md) states how many classes this table runs;
test_documented_count holds it to that.
"""

import hashlib
import importlib.util
import os
import json
import re
import subprocess
from pathlib import Path
from typing import List

import pytest

from tests.forked_cli import ForkedCli
from tests.helpers import REPO, run_launcher

pytestmark = pytest.mark.timeout(480)


def fake_run(tmp_path: Path, name: str, config_text: str) -> Path:
    """A run directory as a finished run leaves it, with the given recorded config.yaml."""
    run = tmp_path / "old" / name
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(config_text)
    (run / "plan.json").write_text("{}\n")
    (run / "summary.json").write_text(json.dumps({"status": "completed"}) + "\n")
    return run


def cases(tmp_path):
    """(argv, words the one line must contain, extra environment or None)."""
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("trainer: [unclosed\n")
    unreadable = tmp_path / "binary.yaml"
    unreadable.write_bytes(b"\xff\xfe\x00bad")
    (tmp_path / "adir").mkdir()
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    script = tmp_path / "script.py"
    script.write_text("print('never run')\n")
    empty_secret = tmp_path / "empty.secret"
    empty_secret.write_text("\n")
    c10d_node = ["--nodes", "2", "--gpus", "1", "--rdzv-endpoint", "127.0.0.1:29555"]
    listed = tmp_path / "list.yaml"
    listed.write_text("- trainer.steps=5\n")
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    bomb = tmp_path / "bomb.yaml"  # "billion laughs": each alias line multiplies the one before
    bomb.write_text("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{k}: &{k} [{', '.join(['*' + p] * 9)}]\n" for p, k in zip("abcdefgh", "bcdefghi")))
    deep = tmp_path / "deep.yaml"
    deep.write_text("trainer: " + "[" * 50_000 + "]" * 50_000 + "\n")
    repeated = tmp_path / "repeated.yaml"
    repeated.write_text("trainer:\n  steps: 5\ntrainer:\n  lr: 0.1\n")
    no_slurm = tmp_path / "bin-without-slurm"  # the launcher runs as sys.executable: it needs nothing on PATH
    no_slurm.mkdir()
    tagged = tmp_path / "set.yaml"
    tagged.write_text("trainer: !!set {a, b}\n")
    empty_key = tmp_path / "empty-key.yaml"
    empty_key.write_text("trainer:\n  \"\": 5\n")
    fifo = tmp_path / "members.fifo"
    os.mkfifo(fifo)
    elastic = ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29556"]
    unreachable = {"AWS_ENDPOINT_URL": "http://127.0.0.1:1", "STORAGE_EMULATOR_HOST": "http://127.0.0.1:1",
                   "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    no_credentials = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "",
                      "AWS_EC2_METADATA_DISABLED": "true", "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
                      "AWS_CONFIG_FILE": str(tmp_path / "none"), "HOME": str(tmp_path)}
    return [
        (["--nodes", "0"], "--nodes=0 must be at least 1", None),
        (["--gpus", "0"], "--gpus=0 must be at least 1", None),
        (["--gpus", "two"], "--gpus expects a whole number, got 'two'", None),
        (["--nodes", "1.5"], "--nodes expects a whole number", None),
        (["gpus=-1"], "--gpus=-1 must be at least 1", None),
        (["trainer.nosuch=1"], "unknown config key 'trainer.nosuch'", None),
        (["trainer.steps=many"], "wrong type for 'trainer.steps'", None),
        (["--config", str(tmp_path / "missing.yaml")], "no such file", None),
        (["--config", str(bad_yaml)], "not valid YAML", None),
        (["--config", str(unreadable)], str(unreadable), None),
        (["--config", str(tmp_path / "adir")], "is a directory", None),
        (["missing_script.py"], "script missing_script.py does not exist", None),
        (["adir"], "script adir is a directory", None),
        ([f"output_dir={a_file}/sub"], "cannot be written", None),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag", None),
        (["checkpoint.keep=0"], "checkpoint.keep=0 must be at least 1", None),
        (["checkpoint.every_steps=-5"], "checkpoint.every_steps=-5 must be at least 0", None),
        (["checkpoint.grace_s=60"], "checkpoint.grace_s=60.0 must be in (0, 12]", None),
        # malformed key=value values
        (["wandb.tags=[a,b"], "brackets or braces do not balance", None),
        (["slurm.extra={exclusive: true"], "brackets or braces do not balance", None),
        (["wandb.project=]"], "brackets or braces do not balance", None),
        # a YAML file that is not a mapping, or empty
        (["--config", str(listed)], "holds a list at the top level, not a mapping", None),
        (["--config", str(scalar)], "holds a single value (int) at the top level", None),
        (["--config", str(empty)], "is empty", None),
        # the same as a run's recorded config.yaml on resume
        (["resume", str(fake_run(tmp_path, "listed", "- a\n"))], "holds a list at the top level", None),
        (["resume", str(fake_run(tmp_path, "emptied", ""))], "is empty", None),
        # SLURM asked for where its commands are not (also a dry run)
        (["--cluster", "slurm"], "sbatch is not on PATH", {"PATH": str(no_slurm)}),
        (["--cluster", "slurm", "--dry-run"], "sbatch is not on PATH", {"PATH": str(no_slurm)}),
        # non-finite numbers
        (["trainer.lr=nan"], "trainer.lr=nan is not a finite number", None),
        (["trainer.lr=inf"], "trainer.lr=inf is not a finite number", None),
        (["trainer.max_grad_norm=-inf"], "trainer.max_grad_norm=-inf is not a finite number", None),
        # ~ is not expanded inside key=value
        (["output_dir=~/runs"], "'~' is not expanded", None),
        (["checkpoint.dir=~/ckpt"], "'~' is not expanded", None),
        # a master port that nothing would use
        (["--master-port", "29600"], "--master-port is not used by a single-node run", None),
        (["--nodes", "2", "--master-port", "29600"], "--master-port is not used by --nodes 2", None),
        # absurd CPU worker counts
        (["--gpus", "200", str(script)], "200 CPU workers on this machine", None),
        # run_id is a name, not a path
        (["run_id=a/b"], "run_id='a/b' is not a name", None),
        (["run_id=.."], "run_id='..' is not a name", None),
        (["run_id=."], "run_id='.' is not a name", None),
        (["run_id=a\tb"], "holds control characters", None),
        (["run_id=" + "r" * 300], "run_id is 300 bytes long", None),
        # a rendezvous secret file that gives no secret (read before the node meets the others)
        ([*c10d_node, "--rdzv-secret-file", str(tmp_path / "no-such.secret")], "no-such.secret cannot be read", None),
        ([*c10d_node, "--rdzv-secret-file", str(empty_secret)], "is empty: put the job's secret in it", None),
        # bytes that are not UTF-8 in a config value (sys.argv holds them as surrogate escapes)
        (["run_id=r\udcff"], "override run_id=...: holds bytes that are not UTF-8 text", None),
        (["seed=\udcff"], "override seed=...: holds bytes that are not UTF-8 text", None),
        # YAML that would take unbounded time or memory, or a recursion too deep to parse
        (["--config", str(bomb)], "uses a YAML alias (*name), which is refused here", None),
        (["--config", str(deep)], "nests deeper than 32 levels, the limit", None),
        (["wandb.tags=" + "[" * 50_000 + "]" * 50_000], "the value nests deeper than 32 levels", None),
        (["wandb.tags=[&a [x, x], *a]"], "the value uses a YAML alias", None),
        (["seed=" + "9" * 5000], "holds a number too long to read", None),
        (["--config", str(repeated)], "repeats the key 'trainer' (line 3): keep one", None),
        # whole numbers beyond what they can be
        (["seed=99999999999999999999999"], "seed=99999999999999999999999 is out of range: it must be in [0, 4294967295]", None),
        (["trainer.steps=" + str(2**64)], "trainer.steps=18446744073709551616 is out of range: it must be in [1,", None),
        (["--nodes", str(2**64)], "--nodes=18446744073709551616 is out of range: it must be in [1, 65536]", None),
        (["--max-restarts", str(2**64)], "launcher.max_restarts=18446744073709551616 is out of range", None),
        (["--gpus", "100000"], "--gpus=100000 is out of range: it must be in [1, 4096]", None),
        (["data.dataset_size=" + str(2**70)], "data.dataset_size=1180591620717411303424 is out of range", None),
        # sizes of the model
        (["model.hidden=-4"], "model.hidden=-4 must be at least 1", None),
        (["model.heads=0"], "model.heads=0 must be at least 1", None),
        # checkpoint.dir that is not a local directory
        ([f"checkpoint.dir={a_file}"], "is an existing file, not a directory", None),
        (["checkpoint.dir=nosuch://bucket/x"], "nosuch:// is not a storage scheme fsspec knows", None),
        (["checkpoint.dir=s3://KEY:SECRET@bucket/x"], "credentials do not belong in the URL", None),
        # --config given nothing, or something that is not a file
        (["--config", ""], "--config was given an empty name", None),
        (["--config", "/dev/null"], "--config /dev/null is not a regular file", None),
        # a module that is not there (found, never imported, before anything is made)
        (["-m", "no_such_module"], "-m no_such_module: no such module here", None),
        (["-m", "no_such_pkg.train"], "-m no_such_pkg.train: cannot be found (ModuleNotFoundError", None),
        # what a key=value names
        (["trainer..steps=5"], "the key has an empty part", None),
        (["trainer=5"], "'trainer' is a section of keys, not a single value", None),
        # scale's list of sizes (its own output_dir: argv[0] is the subcommand)
        (["scale", "--gpus", "1,,2", f"output_dir={tmp_path / 'runs'}"], "--gpus 1,,2: an empty size between commas", None),
        (["scale", "--gpus", "100000", f"output_dir={tmp_path / 'runs'}"], "--gpus=100000 is out of range: it must be in [1, 4096]", None),
        # rendezvous options, checked before anything starts (torch would raise once the node meets the others)
        ([*elastic, "--rdzv-conf", "last_call_timeout=abc", str(script)], "--rdzv-conf last_call_timeout=abc: last_call_timeout is", None),
        ([*elastic, "--rdzv-conf", "read_timeout=-1", str(script)], "--rdzv-conf read_timeout=-1: read_timeout is", None),
        (["--nodes", "1:2", "--rdzv-endpoint", "127.0.0.1:29557", "rdzv.conf.last_call_timeout=abc"],
         "rdzv.conf.last_call_timeout=abc: ", None),
        (["rdzv.conf.keep_alive_interval=2.5"], "keep_alive_interval is seconds between a node's keep-alives", None),
        (["--nproc-per-node", "\u00b2", str(script)], "--nproc-per-node \u00b2: the launcher takes a number, gpu, cpu or auto", None),
        (["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", str(script)],
         "port 0 picks a free port, which the other nodes", None),
        (["--rdzv-endpoint", "localhost:0"], "port 0 (a free port) is for one node", None),
        # object-store URLs: a scheme that keeps the record, a bucket, one line for a store that cannot be used
        (["output_dir=memory://x/y"], "output_dir=memory://x/y: memory:// keeps what is written in this process only", None),
        (["checkpoint.dir=zip://x"], "checkpoint.dir=zip://x: zip:// takes no writes here", None),
        (["output_dir=s3:///x"], "output_dir=s3:///x: names no bucket: write s3://BUCKET/PREFIX", None),
        (["output_dir=s3://bucket/a\nb"], "the value holds a line break, which would be read as a space", None),
        (["ls", "s3:///x"], "s3:///x: names no bucket", None),
        (["ls", "memory://x"], "memory:// keeps what is written in this process only", None),
        (["ls", "zip://x"], "zip:// takes no writes here", None),
        (["ls", "s3://bucket/x"], "cannot reach the object store at http://127.0.0.1:1", unreachable),
        (["checkpoint.dir=gs://bucket/x"], "checkpoint.dir=gs://bucket/x: cannot reach the object store at http://127.0.0.1:1 (",
         unreachable),
        (["ls", "s3://bucket/x"], "no credentials for s3:// were found (NoCredentialsError): set AWS_ACCESS_KEY_ID", no_credentials),
        # config files and lists
        (["--config", str(tagged)], "uses the YAML tag !!set (line 1), which is refused here", None),
        (["trainer.lr=!!set {a}"], "the value uses the YAML tag !!set", None),
        (["--config", str(empty_key)], "holds an empty (or null) key under 'trainer'", None),
        (["sweep", "--list", str(fifo), f"output_dir={tmp_path / 'runs'}"], f"--list {fifo} is not a regular file", None),
        # messages that named another problem than the real one
        (["--nnodes", "1:2", "--standalone", str(script)], "--nnodes 1:2 asks for up to 2", None),
        (["--nodes", "-1:2"], "--nodes -1:2: MIN:MAX needs 1 <= MIN <= MAX", None),
        (["trainer.max-grad-norm=1.0"], "config keys are spelled with '_', not '-': write trainer.max_grad_norm=1.0", None),
        (["trainer.st\udcffeps=5"], "override trainer.st\\xffeps=...: the key holds bytes that are not UTF-8 text", None),
        (["trainer.steps-=5"], "'-=' is not an override's form: write trainer.steps=5", None),
        (["=5"], "'=5' has no key before '='", None),
        (["wandb.tags=a,b"], "wandb.tags is a list: write wandb.tags=[a,b]", None),
        (["launcher.role="], "launcher.role was given no value: give one, e.g. launcher.role=default", None),
        (["ls", str(tmp_path / "adir"), "--since", "-5m"], "--since -5m: say how long ago without a sign", None),
        (["cluster=ray"], "--cluster ray needs the cluster's address", {"RAY_ADDRESS": ""}),
    ]


def snapshot(root: Path) -> dict:
    """Every path under root, with a file's content hash and mtime: what a bad input must leave alone."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            if p.is_file() else "dir" for p in sorted(root.rglob("*"))}


def with_output_dir(argv: List[str], out: Path) -> List[str]:
    own_dir = argv[0] in ("resume", "scale", "sweep", "ls") or any(a.startswith("output_dir=") for a in argv)
    return [*argv] if own_dir else [f"output_dir={out}", *argv]


def assert_refused(argv: List[str], words: str, result: subprocess.CompletedProcess) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (argv, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), (argv, result.stderr)
    assert words in lines[0], (argv, lines[0])
    assert "Traceback" not in result.stderr + result.stdout


def test_each_bad_input_gives_one_line_and_exit_2(tmp_path):
    """Each case a real launcher process, forked after the command line's imports (tests/forked_cli.py)."""
    out = tmp_path / "runs"
    with ForkedCli(tmp_path) as cli:
        for argv, words, env in cases(tmp_path):
            before = snapshot(tmp_path)
            assert_refused(argv, words, cli.run(with_output_dir(argv, out), cwd=tmp_path, env=env))
            assert snapshot(tmp_path) == before, f"{argv} changed files under {tmp_path}"


SAMPLE = ("--gpus 0", "adir", "-m no_such_module", "--cluster slurm")  # a flag, a script, a module, an environment


def test_a_sample_of_the_table_reads_the_same_from_a_fresh_interpreter(tmp_path):
    """What the forked cases show is what `python -m launcher` shows: the same line, the same exit, for a sample."""
    out = tmp_path / "runs"
    sample = [case for case in cases(tmp_path) if " ".join(case[0]) in SAMPLE]
    assert len(sample) == len(SAMPLE)
    with ForkedCli(tmp_path) as cli:
        for argv, words, env in sample:
            fresh = run_launcher(with_output_dir(argv, out), cwd=tmp_path, timeout=60, env=env)
            forked = cli.run(with_output_dir(argv, out), cwd=tmp_path, env=env)
            assert_refused(argv, words, fresh)
            assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def where_this_machine_allows(tmp_path: Path) -> list:
    """Cases that need what a machine may or may not have: hdfs:// without pyarrow (where it is installed, it is
    used), and `ls` of a folder that is there but may not be read (/proc/1/root for a root without CAP_SYS_PTRACE,
    as in a container)."""
    found = []
    if importlib.util.find_spec("pyarrow") is None:
        found.append((["checkpoint.dir=hdfs://nn/x"], "checkpoint.dir=hdfs://nn/x: hdfs:// needs a package that is "
                      "not installed: pip install pyarrow"))
        found.append((["ls", "hdfs://nn/x"], "hdfs:// needs a package that is not installed"))
    try:
        os.scandir("/proc/1/root").close()
    except PermissionError:
        found.append((["ls", "--json", "/proc/1/root"], "/proc/1/root: cannot read it (Permission denied)"))
    return found


def test_what_this_machine_lacks_or_may_not_read_is_one_line(tmp_path):
    cases = where_this_machine_allows(tmp_path)
    if not cases:
        pytest.skip("pyarrow is installed and /proc/1/root is readable here")
    with ForkedCli(tmp_path) as cli:
        for argv, words in cases:
            before = snapshot(tmp_path)
            assert_refused(argv, words, cli.run(with_output_dir(argv, tmp_path / "runs"), cwd=tmp_path))
            assert snapshot(tmp_path) == before, argv


def test_an_unknown_keys_value_is_not_echoed(tmp_path):
    result = run_launcher(["trainer.api_key=sk-live-123456", f"output_dir={tmp_path}"], cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and "trainer.api_key" in result.stderr
    assert "sk-live-123456" not in result.stderr + result.stdout


def test_documented_count(tmp_path):
    """The documentation's count of bad-input classes is what this table runs."""
    text = (REPO / "docs" / "configuration.md").read_text()
    stated = re.search(r"`tests/test_bad_input.py` runs (\d+) of them", text)
    assert stated, "docs/configuration.md's bad-input section lost its count"
    assert int(stated.group(1)) == len(cases(tmp_path))


def test_a_script_argument_in_bytes_reaches_the_script_unchanged(tmp_path):
    """Not bad input: a script's arguments are its own, bytes included, as under torchrun (the launcher's records
    write them as \\uDCxx escapes; config.yaml reads back to the same arguments)."""
    script = tmp_path / "argv.py"
    script.write_text("import os, sys\n"
                      "open(os.path.join(os.path.dirname(__file__), 'argv.out'), 'w')"
                      ".write(repr([os.fsencode(a) for a in sys.argv[1:]]))\n")
    raw = os.fsdecode(b"\xff\xfe-not-utf8")  # what sys.argv holds for these bytes
    result = run_launcher([f"output_dir={tmp_path / 'runs'}", "--gpus", "1", str(script), raw, "b c"], cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert (tmp_path / "argv.out").read_text() == repr([b"\xff\xfe-not-utf8", b"b c"])
    (run,) = (tmp_path / "runs").iterdir()
    from launcher.config.schema import load_config

    assert load_config(str(run / "config.yaml")).script.args == [raw, "b c"]
    assert json.loads((run / "plan.json").read_text())["command"][-2:] == [raw, "b c"]
