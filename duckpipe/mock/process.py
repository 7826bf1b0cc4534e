"""Run a mock dataplane as a child process (for tests, examples and the demo)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import zmq

from ..errors import DataplaneUnavailable
from ..schema import control as ctl

__all__ = ["MockDataplaneProcess", "control_request", "ping"]


def control_request(control: str, msg: ctl.Request, timeout: float = 0.5) -> ctl.AnyReply | None:
    """One request on a throwaway socket, without attaching; None if nobody answers in time."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(control)
        sock.send(ctl.encoder.encode(msg))
        if not sock.poll(int(timeout * 1000)):
            return None
        return ctl.reply_decoder.decode(sock.recv())
    finally:
        sock.close()


def ping(control: str, timeout: float = 0.5) -> ctl.Stats | None:
    """The dataplane's stats, or None if nobody answers at ``control`` in time."""
    reply = control_request(control, ctl.GetStats(req_id=1), timeout)
    return reply if isinstance(reply, ctl.Stats) else None


class MockDataplaneProcess:
    """``with MockDataplaneProcess(ducks=24) as dp: duckpipe.connect(dp.control)``.

    Without ``control`` it listens on an ipc socket in a fresh private directory.
    """

    def __init__(
        self,
        *,
        ducks: int = 8,
        control: str | None = None,
        args: Sequence[str] = (),
        ready_timeout: float = 30.0,
    ) -> None:
        self._tmp: tempfile.TemporaryDirectory | None = None
        if control is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="duckpipe-")
            control = f"ipc://{self._tmp.name}/control"
        self.control = control
        self.ducks = ducks
        self.args = list(args)
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> MockDataplaneProcess:
        if ping(self.control, 0.3) is not None:  # else we would mistake it for our child
            raise DataplaneUnavailable(f"a dataplane is already running at {self.control}")
        cmd = [
            sys.executable,
            "-m",
            "duckpipe",
            "mock-dataplane",
            "--control",
            self.control,
            "--ducks",
            str(self.ducks),
            *self.args,
        ]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DataplaneUnavailable(
                    f"mock dataplane exited with {self.proc.returncode}:\n{self.output()}"
                )
            if ping(self.control, 0.2) is not None:
                return self
            time.sleep(0.02)
        self.kill()
        raise DataplaneUnavailable(
            f"mock dataplane did not come up in {self.ready_timeout:g} s:\n{self.output()}"
        )

    def output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def stop(self, timeout: float = 5.0) -> int | None:
        """Shut down politely (Shutdown, then SIGTERM, then SIGKILL)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        control_request(self.control, ctl.Shutdown(req_id=1), timeout)
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None:
                self.proc.send_signal(sig)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                continue
        return None

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> MockDataplaneProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._log.close()
        if self._tmp is not None:
            Path(self.control[len("ipc://") :]).unlink(missing_ok=True)
            self._tmp.cleanup()
