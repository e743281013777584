"""Fixtures of the generated-client round trip: a real gpu-ops server on an ephemeral port
(API keys on, client seeds allowed for deterministic DP noise, BFV dealer mode) and the openapi-python-client
package generated from openapi/openapi.json.

GPU_OPS_BIN names the server binary (default target/debug/gpu-ops) and GPU_OPS_CLIENT_DIR
the directory holding the generated package `gpu_ops_client` (default target/python-client),
both relative to the repository root; scripts/client-check.sh sets both. A missing binary or
client fails the run with a message saying how to make it: nothing is skipped. Should a
test skip all the same, the hook below appends `SKIP <test>: <why>` to the file
GPU_OPS_SKIP_LOG names, which CI compares with the README's list of tests allowed to skip
(scripts/check_skips.py), as the Rust tests' skips are (gpu_ops::skips).
"""

import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
SPEC_PATH = REPO / "openapi" / "openapi.json"
BIN = (REPO / os.environ.get("GPU_OPS_BIN", "target/debug/gpu-ops")).resolve()
CLIENT_DIR = (REPO / os.environ.get("GPU_OPS_CLIENT_DIR", "target/python-client")).resolve()
sys.path.insert(0, str(CLIENT_DIR))

API_KEY = "client-roundtrip-key-0001"
TENANT = "roundtrip"
START_TIMEOUT_S = 60
HTTP_TIMEOUT = httpx.Timeout(60.0)


def pytest_runtest_logreport(report):
    """Every skipped test, to the skip log."""
    log = os.environ.get("GPU_OPS_SKIP_LOG")
    if not (report.skipped and log):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"SKIP tests/client/{report.nodeid.split('tests/client/')[-1]}: {reason}\n")


class ServerProcess:
    """One gpu-ops process: started with the flags the round trip needs, its stderr (JSON
    logs) drained by a thread into a short backlog that failures can show."""

    def __init__(self, data_dir: Path, keys_file: Path, flags: tuple[str, ...] = ()):
        self.data_dir = data_dir
        self.keys_file = keys_file
        self.flags = flags
        self.proc = None
        self.url = None
        self.log = collections.deque(maxlen=200)

    def start(self) -> "ServerProcess":
        if not BIN.is_file():
            pytest.fail(
                f"no server binary at {BIN}: run `cargo build` or set GPU_OPS_BIN",
                pytrace=False,
            )
        self.proc = subprocess.Popen(
            [
                str(BIN),
                "--bind", "127.0.0.1:0",
                "--backend", "cpu",
                "--cpu-threads", "1",
                "--log-format", "json",
                "--data-dir", str(self.data_dir),
                "--api-keys-file", str(self.keys_file),
                "--dp-allow-client-seed",
                *self.flags,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        addresses = queue.Queue()
        threading.Thread(target=self._drain, args=(addresses,), daemon=True).start()
        try:
            address = addresses.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            address = None
        if address is None:
            self.kill()
            pytest.fail(
                f"{BIN} did not log `listening` within {START_TIMEOUT_S} s:\n" + self.backlog(),
                pytrace=False,
            )
        self.url = f"http://{address}"
        return self

    def _drain(self, addresses: queue.Queue) -> None:
        """Reads every log line (so the server never blocks on a full pipe); hands the first
        `listening` address over, or None when the log ends before one."""
        announced = False
        for line in self.proc.stderr:
            self.log.append(line.rstrip("\n"))
            if announced:
                continue
            try:
                fields = json.loads(line).get("fields", {})
            except ValueError:
                continue
            if fields.get("message") == "listening":
                addresses.put(fields["address"])
                announced = True
        if not announced:
            addresses.put(None)

    def backlog(self) -> str:
        return "\n".join(self.log)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        """Sends `sig` and waits for the exit (SIGKILL past `timeout`)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def keys_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "api-keys"
    path.write_text(f"{API_KEY} {TENANT}\n")
    return path


@pytest.fixture(scope="session")
def start_server(tmp_path_factory, keys_file):
    """Starts servers (each on its own data dir unless one is given, with the common flags
    and `flags`) and stops them all at the end of the session."""
    started = []

    def start(data_dir: Path | None = None, flags: tuple[str, ...] = ()) -> ServerProcess:
        server = ServerProcess(data_dir or tmp_path_factory.mktemp("data"), keys_file, flags)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def server(start_server) -> ServerProcess:
    """The server most round trips use: a dealer for BFV keys and decryption too."""
    return start_server(flags=("--he-dealer-mode",))


@pytest.fixture(scope="session")
def no_dealer(start_server) -> ServerProcess:
    """A server as deployed: no BFV keys or decryption."""
    return start_server()


@pytest.fixture(scope="session")
def connect():
    """Makes a generated client of a server URL: authenticated with `token` (the test
    tenant's key by default), anonymous with None. Statuses the spec does not document for
    an operation raise `UnexpectedStatus`."""
    from gpu_ops_client import AuthenticatedClient, Client

    def connect(url: str, token: str | None = API_KEY):
        common = dict(base_url=url, timeout=HTTP_TIMEOUT, raise_on_unexpected_status=True)
        if token is None:
            return Client(**common)
        return AuthenticatedClient(token=token, **common)

    return connect


@pytest.fixture(scope="session")
def client(server, connect):
    return connect(server.url)


@pytest.fixture(scope="session")
def anon(server, connect):
    return connect(server.url, token=None)


@pytest.fixture(scope="session")
def spec() -> dict:
    return json.loads(SPEC_PATH.read_text())
