"""Fixtures: a real weenv-envd on the stack the Rust harness started
(``integration/tests/envd_python.rs``: registry, weenv daemon, containerd with the weenv
shim, published groups and a plan), handed over in environment variables:

- ``WEENV_TEST_ENVD_CMD``: JSON argv of ``weenv-envd`` (the fixture adds ``--socket``), so
  the tests can restart the service; or ``WEENV_ENVD_ADDRESS`` of a running one (restart
  tests are then skipped);
- ``WEENV_TEST_PLAN`` (plan file), ``WEENV_TEST_PLAN_REF`` (the same plan published as a
  plan artifact), ``WEENV_TEST_GROUPS`` (JSON list), ``WEENV_TEST_IMAGE``
  (an ordinary image), ``WEENV_TEST_CTR`` (JSON argv prefix of ``ctr -a SOCK -n NS``),
  ``WEENV_TEST_LEDGER`` (the shim's ledger dir).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from weenv import Client

HERE = Path(__file__).parent


def _wait_socket(path: str, proc: subprocess.Popen[bytes] | None, limit: float = 30.0) -> None:
    t = time.monotonic()
    while time.monotonic() - t < limit:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"weenv-envd exited with {proc.returncode}")
        if os.path.exists(path):
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(path)
                return
            except OSError:
                pass
        time.sleep(0.05)
    raise RuntimeError(f"weenv-envd did not listen on {path} within {limit} s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1] if name in cmd else ""


def with_flags(cmd: list[str], flags: dict[str, str]) -> list[str]:
    out = list(cmd)
    for k, v in flags.items():
        if k in out:
            out[out.index(k) + 1] = v
        else:
            out += [k, v]
    return out


class Service:
    """The weenv-envd under test (started and restarted by the fixture, if it may)."""

    def __init__(self, variant: str = "", extra: list[str] | None = None) -> None:
        """``variant``: a second service on the same stack (its own namespace, state and shim
        ledger: another node as far as placement can tell); ``extra``: more flags."""
        self.cmd: list[str] | None = None
        raw = os.environ.get("WEENV_TEST_ENVD_CMD")
        self.dir = tempfile.mkdtemp(prefix="weenv-envd-py-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = Path(self.dir) / "envd.log"
        if raw:
            self.cmd = json.loads(raw)
            if variant:
                self.cmd = with_flags(
                    self.cmd,
                    {
                        "--namespace": flag(self.cmd, "--namespace") + "-" + variant,
                        "--state-dir": os.path.join(self.dir, "state"),
                        "--shim-ledger-dir": os.path.join(self.dir, "ledger"),
                    },
                )
            self.cmd += extra or []
            self.socket = os.path.join(self.dir, "envd.sock")
            self.address = "unix://" + self.socket
            self.token = "t-" + os.urandom(8).hex()
            Path(self.dir, "token").write_text(self.token)
            self.tcp = f"127.0.0.1:{free_port()}"
            self.start()
        else:
            self.address = os.environ.get("WEENV_ENVD_ADDRESS", "")
            self.socket = ""
            self.tcp = ""
            self.token = ""

    @property
    def can_restart(self) -> bool:
        return self.cmd is not None

    def start(self) -> None:
        assert self.cmd is not None
        args = [
            *self.cmd,
            "--socket",
            self.socket,
            "--tcp",
            self.tcp,
            "--token-file",
            os.path.join(self.dir, "token"),
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=log)
        _wait_socket(self.socket, self.proc)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self, sig: int = signal.SIGTERM) -> None:
        self.stop(sig)
        self.start()

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text().splitlines()[-n:])
        except OSError:
            return ""


@pytest.fixture(scope="session")
def service() -> Iterator[Service]:
    if not os.environ.get("WEENV_TEST_ENVD_CMD") and not os.environ.get("WEENV_ENVD_ADDRESS"):
        pytest.skip("no service: set WEENV_TEST_ENVD_CMD or WEENV_ENVD_ADDRESS")
    s = Service()
    yield s
    stop_and_clean(s)


def stop_and_clean(s: Service) -> None:
    if s.can_restart and s.proc is not None:
        c = Client(s.address)
        left = [e.id for e in c.list()]
        if left:
            c.delete(left)
        c.close()
    s.stop()


def extra_service(service: Service, variant: str, extra: list[str]) -> Iterator[Service]:
    if not service.can_restart:
        pytest.skip(f"a {variant} service needs WEENV_TEST_ENVD_CMD")
    s = Service(variant, extra)
    yield s
    stop_and_clean(s)


@pytest.fixture
def second_service(service: Service) -> Iterator[Service]:
    """Another service on the same stack (another node to placement)."""
    yield from extra_service(service, "b", [])


@pytest.fixture
def pooled_service(service: Service) -> Iterator[Service]:
    """A service with a warm pool (--pool 4), in a namespace of its own."""
    yield from extra_service(service, "pool", ["--pool", "4"])


@pytest.fixture
def client(service: Service) -> Iterator[Client]:
    c = Client(service.address)
    yield c
    c.close()


@pytest.fixture
def plan() -> str:
    p = os.environ.get("WEENV_TEST_PLAN")
    if not p:
        pytest.skip("WEENV_TEST_PLAN not set")
    return p


@pytest.fixture
def plan_ref() -> str:
    r = os.environ.get("WEENV_TEST_PLAN_REF")
    if not r:
        pytest.skip("WEENV_TEST_PLAN_REF not set")
    return r


@pytest.fixture
def groups() -> list[str]:
    g = os.environ.get("WEENV_TEST_GROUPS")
    if not g:
        pytest.skip("WEENV_TEST_GROUPS not set")
    return list(json.loads(g))


@pytest.fixture
def image() -> str:
    i = os.environ.get("WEENV_TEST_IMAGE")
    if not i:
        pytest.skip("WEENV_TEST_IMAGE not set")
    return i


def ctr(*args: str) -> str:
    pre = os.environ.get("WEENV_TEST_CTR")
    if not pre:
        pytest.skip("WEENV_TEST_CTR not set")
    return subprocess.run(
        [*json.loads(pre), *args], check=True, capture_output=True, text=True
    ).stdout
