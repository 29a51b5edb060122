"""The servers and shared runs of tests/test_object_store.py: moto's S3 server and the GCS emulator on loopback, the
TCP relay a test can cut ("the store stops answering"), the credentials (whose secret must reach no file), and the
module's one bucket run; kept apart so the test module holds the tests."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, List

import pytest

from tests.helpers import QUIET, REPO, SESSION_PIDS, kill_group, run_launcher

SECRET = "test-secret-never-recorded-9f3c"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing-key-id", "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1"}
STEPS = 24


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Relay:
    """127.0.0.1:port -> target port, byte for byte; close() makes the endpoint refuse and cuts every connection."""

    def __init__(self, target: int) -> None:
        self.target, self.port = target, free_port()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._open: List[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                return
            self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(1 << 16):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._server.close()
        for s in self._open:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass


@contextlib.contextmanager
def serving(argv: List[str], port: int, what: str) -> Iterator[None]:
    """A server (argv) answering on 127.0.0.1:port for a module's tests, killed by its pid at the end."""
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    SESSION_PIDS.add(proc.pid)  # kept for the module's tests: not a test's leftover
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, f"{what} did not start"
                time.sleep(0.2)
        yield
    finally:
        kill_group(proc)
        proc.wait(timeout=30)
        SESSION_PIDS.discard(proc.pid)


@pytest.fixture(scope="module")
def moto():
    """moto's S3 server on a free loopback port."""
    port = free_port()
    with serving([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port, "moto's server"):
        yield port


@pytest.fixture(scope="module")
def store_env(moto, monkeypatch_module):
    """This process talks to moto directly (to look at the bucket); launchers get a relay's endpoint."""
    for key, value in {**CREDENTIALS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{moto}"}.items():
        monkeypatch_module.setenv(key, value)
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir("ckpts")
    fs.mkdir("runs")
    return fs


@pytest.fixture(scope="module")
def bucket_run(store_env, moto, tmp_path_factory):
    """One uninterrupted run with output_dir=s3://runs/exp (its checkpoints there too): the record the `ls` test
    reads, and the reference the resume test compares with. Its staging folder is under its own TMPDIR."""
    tmp = tmp_path_factory.mktemp("bucket-run")
    env = {**CREDENTIALS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{moto}", "TMPDIR": str(tmp)}
    result = run_launcher([*job(), "output_dir=s3://runs/exp"], cwd=tmp, timeout=240, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    store_env.invalidate_cache()
    runs = [p.rsplit("/", 1)[-1] for p in store_env.ls("runs/exp")]
    assert len(runs) == 1, runs
    return {"run_id": runs[0], "tmp": tmp, "env": env, "result": result}


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def via(relay: Relay) -> dict:
    return {**CREDENTIALS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{relay.port}"}


def job(*extra: str) -> List[str]:
    return ["--gpus", "2", f"trainer.steps={STEPS}", "checkpoint.every_steps=8", "trainer.log_every=8", *QUIET, *extra]


def published(fs, prefix: str) -> List[str]:
    fs.invalidate_cache()  # the launchers changed the bucket since this process last listed it
    return sorted(p.split("/")[-2] for p in fs.glob(f"ckpts/{prefix}/step-*/manifest.json"))


def read_until(proc: subprocess.Popen, marker: str) -> List[str]:
    """A started launcher's output lines up to and with the first that holds marker (all of it if none does)."""
    lines: List[str] = []
    for line in proc.stdout:
        lines.append(line)
        if marker in line:
            break
    return lines


def assert_no_secret(run_dir: Path) -> None:
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), f"the secret key is in {path}"


@pytest.fixture(scope="module")
def gcs():
    """gcp-storage-emulator (the GCS JSON API, in memory) on a free loopback port, with the bucket ckpts and GCS's
    moveTo (tests/gcs_emulator.py); gcsfs reaches it through STORAGE_EMULATOR_HOST, as Google's own clients reach an
    emulator."""
    pytest.importorskip("gcsfs")
    pytest.importorskip("gcp_storage_emulator")
    port = free_port()
    with serving([sys.executable, "-m", "tests.gcs_emulator", "start", "--host", "127.0.0.1", "--port", str(port),
                  "--in-memory", "--quiet", "--default-bucket", "ckpts"], port, "the GCS emulator"):
        yield {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}
