"""Launch the C dataplane: ``duckpipe dataplane [--config FILE]`` and :class:`DataplaneProcess`."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

import msgspec

from .. import host
from ..errors import DataplaneUnavailable
from .binaries import find_binary
from .process import DataplaneChild
from .topology import Topology, loopback

__all__ = ["DataplaneProcess", "write_config"]


log = logging.getLogger("duckpipe.launch")

#: What the EAL says when net_af_packet cannot join its PACKET_FANOUT group: the PMD
#: derives the group's id from the process (pid ^ ifindex, no devarg sets it), and
#: another process holds that id for another interface. A new process has another pid.
FANOUT_TAKEN = "could not set PACKET_FANOUT"
FANOUT_TRIES = 3

_CONFIG_NAME = re.compile(r"^dataplane-[0-9a-f]{8}-(\d+)-\w+\.msgpack$")


def write_config(topology: Topology, control: str, directory: Path) -> Path:
    """Write the msgpack configuration the C process reads; returns its path.

    Every launch gets its own file, ``dataplane-<hash of control>-<pid>-<random>.msgpack``
    (mode 0600, made with mkstemp): launches side by side never read each other's, and a
    failed launch never overwrites a running dataplane's. The dataplane removes its own
    when it exits (--remove-config); files of launches whose process died without that
    are removed here."""
    _remove_stale_configs(directory)
    tag = hashlib.blake2s(control.encode(), digest_size=4).hexdigest()
    fd, name = tempfile.mkstemp(
        prefix=f"dataplane-{tag}-{os.getpid()}-", suffix=".msgpack", dir=directory
    )
    with os.fdopen(fd, "wb") as f:
        f.write(topology.to_config(control))
    return Path(name)


def _remove_stale_configs(directory: Path) -> None:
    """Config files whose launching process (the dataplane itself, after exec) is gone."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        m = _CONFIG_NAME.match(name)
        if m and not host.process_alive(int(m.group(1))):
            try:
                os.unlink(directory / name)
            except OSError:
                pass


class DataplaneProcess(DataplaneChild):
    """``with DataplaneProcess(topology) as dp: duckpipe.connect(dp.control)``.

    ``binary`` overrides which build runs (the sanitizer build, say); ``backend_args``
    go after ``--`` (EAL options for the dpdk backend).
    ``$DUCKPIPE_DEDICATED_THREADS=1`` forces ``threads = "dedicated"``.
    """

    what = "duckpipe-dataplane"

    def __init__(
        self,
        topology: Topology | None = None,
        *,
        control: str | None = None,
        binary: Path | None = None,
        ready_timeout: float = 20.0,
        verbose: bool = False,
        backend_args: Sequence[str] = (),
    ) -> None:
        self.topology = topology or loopback()
        if os.environ.get("DUCKPIPE_DEDICATED_THREADS") == "1":
            # the ThreadSanitizer run (tools/setup test): every agent on its own thread,
            # whatever mode the test asked for, so that their sharing is what TSan sees
            self.topology = msgspec.structs.replace(self.topology, threads="dedicated")
        super().__init__(
            control=control or self.topology.control or None, ready_timeout=ready_timeout
        )
        self.binary = binary or find_binary("duckpipe-dataplane")
        self.verbose = verbose
        self.backend_args = list(backend_args)

    def start(self):
        """Start and wait until it answers; a start that met another process's af_packet
        fanout group id (:data:`FANOUT_TAKEN`) is tried again as a new process, up to
        :data:`FANOUT_TRIES` times in all, with a warning each time."""
        for attempt in range(1, FANOUT_TRIES + 1):
            try:
                return super().start()
            except DataplaneUnavailable as e:
                if FANOUT_TAKEN not in str(e) or attempt == FANOUT_TRIES:
                    raise
                log.warning(
                    "%s: net_af_packet's fanout group id (pid ^ ifindex) is another "
                    "process's; starting again as a new process (%d of %d)",
                    self.what, attempt + 1, FANOUT_TRIES,
                )  # fmt: skip
                self._log.seek(0)
                self._log.truncate()

    def command(self) -> list[str]:
        config = write_config(self.topology, self.control, self.workdir)
        args = [str(self.binary), "--config", str(config), "--remove-config"]
        args += ["-v"] if self.verbose else []
        return args + (["--", *self.backend_args] if self.backend_args else [])


def run_foreground(
    topology: Topology, control: str | None, verbose: bool, backend_args: list[str] = ()
) -> int:
    """``duckpipe dataplane``: exec the C process with a config written to the run dir,
    which the process removes when it exits (--remove-config)."""
    control = control or topology.control or host.default_control()
    config = write_config(topology, control, host.run_dir())
    binary = find_binary("duckpipe-dataplane")
    args = [str(binary), "--config", str(config), "--remove-config"]
    args += ["-v"] if verbose else []
    if backend_args:
        args += ["--", *backend_args]
    os.execv(binary, args)
    return 0  # not reached
