"""A dataplane as a child process: start it, wait until it answers, stop it, read its log.

The mock (duckpipe.mock.process) and the C dataplane (duckpipe.launch.dataplane) differ only
in the command they run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import zmq

from ..errors import DataplaneUnavailable
from ..schema import control as ctl

__all__ = ["DataplaneChild", "control_request", "ping"]


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


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; reaps it and closes its stdout pipe."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout:
        proc.stdout.close()


class DataplaneChild:
    """Base of the process wrappers: subclasses say what to run in ``command()``.

    Without ``control`` the child listens on an ipc socket in a fresh private
    directory, removed by ``close()``.
    """

    what = "dataplane"

    def __init__(self, *, control: str | None = None, ready_timeout: float = 30.0) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="duckpipe-")
        self.control = control or f"ipc://{self._tmp.name}/control"
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile()

    @property
    def workdir(self) -> Path:
        return Path(self._tmp.name)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self):
        if ping(self.control, 0.3) is not None:  # else we would mistake it for our child
            raise DataplaneUnavailable(f"a dataplane is already running at {self.control}")
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DataplaneUnavailable(
                    f"{self.what} exited with {self.proc.returncode}:\n{self.output()}"
                )
            if ping(self.control, 0.2) is not None:
                return self
            time.sleep(0.02)
        self.kill()
        raise DataplaneUnavailable(
            f"{self.what} did not answer within {self.ready_timeout:g} s:\n{self.output()}"
        )

    def output(self) -> str:
        """What the child printed (its log, and any sanitizer report)."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def stop(self, timeout: float = 5.0) -> int | None:
        """Shutdown, then SIGTERM, then SIGKILL; returns the exit code."""
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

    def close(self) -> None:
        """Drop the log and the private directory (after stop)."""
        self._log.close()
        self._tmp.cleanup()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.close()
