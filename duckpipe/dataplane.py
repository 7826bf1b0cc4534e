"""Launch the C dataplane: ``duckpipe dataplane [--config FILE]`` and :class:`DataplaneProcess`."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from . import runtime
from .binaries import find_binary
from .errors import DataplaneUnavailable
from .mock.process import control_request, ping
from .schema import control as ctl
from .topology import Topology, loopback

__all__ = ["DataplaneProcess", "write_config"]


def write_config(topology: Topology, control: str, directory: Path) -> Path:
    """Write the msgpack configuration the C process reads; returns its path."""
    path = directory / "dataplane.msgpack"
    path.write_bytes(topology.to_config(control))
    path.chmod(0o600)
    return path


class DataplaneProcess:
    """``with DataplaneProcess(topology) as dp: duckpipe.connect(dp.control)``.

    Without ``control`` it listens on an ipc socket in a fresh private directory.
    ``binary`` overrides which build runs (the sanitizer build, say).
    """

    def __init__(
        self,
        topology: Topology | None = None,
        *,
        control: str | None = None,
        binary: Path | None = None,
        ready_timeout: float = 20.0,
        verbose: bool = False,
    ) -> None:
        self.topology = topology or loopback()
        self._tmp = tempfile.TemporaryDirectory(prefix="duckpipe-dp-")
        self.control = control or self.topology.control or f"ipc://{self._tmp.name}/control"
        self.binary = binary or find_binary("duckpipe-dataplane")
        self.ready_timeout = ready_timeout
        self.verbose = verbose
        self.proc: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> DataplaneProcess:
        if ping(self.control, 0.3) is not None:
            raise DataplaneUnavailable(f"a dataplane is already running at {self.control}")
        config = write_config(self.topology, self.control, Path(self._tmp.name))
        cmd = [str(self.binary), "--config", str(config), *(["-v"] if self.verbose else [])]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DataplaneUnavailable(
                    f"duckpipe-dataplane exited with {self.proc.returncode}:\n{self.output()}"
                )
            if ping(self.control, 0.2) is not None:
                return self
            time.sleep(0.02)
        self.kill()
        raise DataplaneUnavailable(
            f"duckpipe-dataplane did not answer within {self.ready_timeout:g} s:\n{self.output()}"
        )

    def output(self) -> str:
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
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def close(self) -> None:
        """Drop the log and the private directory (after stop)."""
        self._log.close()
        self._tmp.cleanup()

    def __enter__(self) -> DataplaneProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.close()


def run_foreground(
    topology: Topology, control: str | None, verbose: bool, backend_args: list[str] = ()
) -> int:
    """``duckpipe dataplane``: exec the C process with a config written to the run dir."""
    control = control or topology.control or runtime.default_control()
    config = write_config(topology, control, runtime.run_dir())
    binary = find_binary("duckpipe-dataplane")
    args = [str(binary), "--config", str(config), *(["-v"] if verbose else [])]
    if backend_args:
        args += ["--", *backend_args]
    os.execv(binary, args)
    return 0  # not reached
