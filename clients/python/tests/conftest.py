"""Fixtures: a real berthd on free loopback ports.

The binary is built once per run from the repository (``go build``) into a
temporary directory, unless BERTHD names one already built.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the berth package, uninstalled

REPO = HERE.parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Berthd:
    """One berthd process with its own data directory and ports; restartable
    on the same directory and ports."""

    def __init__(self, binary: str, workdir: Path, *extra: str):
        self.binary = binary
        self.data = workdir / "data"
        self.logpath = workdir / "berthd.log"
        self.port = free_port()
        self.admin = free_port()
        self.controller = free_port()
        self.extra = list(extra)
        self.proc: subprocess.Popen | None = None
        self.started = False  # once: a restart keeps the ports

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        # A port free_port found may be taken before berthd binds it (by
        # the local end of some connection in the meantime): the first
        # start tries other ports then.
        for attempt in range(3):
            try:
                self._start(timeout)
                self.started = True
                return
            except RuntimeError as e:
                if self.started or attempt == 2 or "address already in use" not in str(e):
                    raise
                self.port, self.admin, self.controller = free_port(), free_port(), free_port()

    def _start(self, timeout: float) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        log = open(self.logpath, "ab")
        self.proc = subprocess.Popen(
            [self.binary, "-listen", self.addr, "-admin", f"127.0.0.1:{self.admin}",
             "-controller", f"127.0.0.1:{self.controller}", "-data", str(self.data),
             "-shards", "2", "-loops", "1", "-log-level", "warn", *self.extra],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.admin}/readyz"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"berthd exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=1) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"berthd not ready within {timeout} s:\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (a graceful shutdown), then SIGKILL after ``timeout``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self, timeout: float = 5.0) -> None:
        """SIGSTOP, returning once the process is stopped (the signal is
        asynchronous: a running berthd could answer one more command)."""
        self.proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while True:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
            if state in ("T", "t"):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"berthd not stopped {timeout} s after SIGSTOP (state {state})")
            time.sleep(0.005)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.logpath.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


@pytest.fixture(scope="session")
def berthd_binary(tmp_path_factory) -> str:
    given = os.environ.get("BERTHD")
    if given:
        return given
    out = tmp_path_factory.mktemp("bin") / "berthd"
    go = os.environ.get("GO", "go")
    if shutil.which(go) is None:
        pytest.fail("go is needed to build berthd (or set BERTHD to a built binary)")
    r = subprocess.run([go, "build", "-o", str(out), "./cmd/berthd"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.fail(f"go build ./cmd/berthd failed:\n{r.stdout}{r.stderr}")
    return str(out)


@pytest.fixture(scope="session")
def berthd(berthd_binary, tmp_path_factory):
    """A berthd shared by the tests that do not stop or pause it. Tests use
    their own queue names."""
    b = Berthd(berthd_binary, tmp_path_factory.mktemp("shared"))
    b.start()
    yield b
    b.stop()


@pytest.fixture
def own_berthd(berthd_binary, tmp_path):
    """A berthd for one test, which may restart, pause or stop it."""
    b = Berthd(berthd_binary, tmp_path)
    b.start()
    yield b
    if b.proc is not None and b.proc.poll() is None:
        b.resume()  # in case the test left it stopped
    b.kill()


def run(coro, timeout: float = 30.0):
    """Run one test coroutine, failing it after ``timeout`` seconds."""
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())
