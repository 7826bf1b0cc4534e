"""The control channel: one ZeroMQ DEALER socket from a client to its dataplane.

Requests (attach, layers, epochs, ...) and their replies travel over it, matched
by ``req_id``; so do the ZeroMQ completions of forwards, which carry what the
slot's done word has no room for (timings, duck ids, the failure message). A
``Channel`` decodes whatever arrives and hands completions to the caller's
callback; it knows nothing of slots or forwards.

The callbacks are passed per call, not stored: a channel holding a bound method of
its client would make a reference cycle, and a client dropped without ``close()``
would then wait for the cycle collector to free its segment.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import zmq

from .._abi.shm import Segment
from ..errors import DataplaneUnavailable, WaitTimeout, refused
from ..schema import control as ctl

__all__ = ["BLOCK_SLICE_S", "Channel"]

log = logging.getLogger("duckpipe.client.api")  # the client's: a channel is part of a client

# The longest one blocking receive waits: between slices the caller looks again at
# whether the dataplane is still alive.
BLOCK_SLICE_S = 0.1

OnCompletion = Callable[[ctl.Completion], None]

_context: zmq.Context | None = None
_context_pid = 0
_context_lock = threading.Lock()


def client_context() -> zmq.Context:
    """duckpipe's own ZeroMQ context, one per process (not ``zmq.Context.instance()``,
    which is the application's): its I/O thread runs SCHED_BATCH, so that waking for a
    burst of completions it does not preempt the model's thread, or a dataplane on the
    same core, but waits for the next tick (docs/benchmark-history.md, issue 19 goal 2)."""
    global _context, _context_pid
    with _context_lock:
        if _context is None or _context_pid != os.getpid():  # a forked child makes its own
            ctx = zmq.Context()
            if hasattr(os, "SCHED_BATCH"):  # before the first socket starts the I/O thread
                ctx.set(zmq.THREAD_SCHED_POLICY, os.SCHED_BATCH)
            _context, _context_pid = ctx, os.getpid()
        return _context


class Channel:
    """A DEALER socket connected to the dataplane's control endpoint.

    ``counters`` is the client's counter table; ``bad_messages`` counts the
    undecodable messages dropped here.
    """

    __slots__ = ("_counters", "_poll_items", "_req_id", "endpoint", "replies", "sock")

    def __init__(self, endpoint: str, counters: dict[str, int]) -> None:
        _check_endpoint(endpoint)
        self.endpoint = endpoint
        self.replies: dict[int, ctl.AnyReply] = {}  # by req_id, until their request takes them
        self._counters = counters
        self._req_id = 0
        self.sock = client_context().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        # for zmq_poll: Socket.poll builds a Poller each call (~12,000 instructions)
        self._poll_items = [(self.sock, zmq.POLLIN)]

    def attach(
        self,
        seg: Segment,
        doorbell_fd: int,
        name: str,
        timeout: float,
        on_completion: OnCompletion,
    ) -> ctl.Attached:
        """Hand ``seg`` and the doorbell pipe's read end ``doorbell_fd`` to the dataplane;
        ``DataplaneUnavailable`` if none answers."""
        att = self.request(
            lambda rid: ctl.Attach(
                req_id=rid,
                abi_major=int(seg.header.abi_major),
                pid=os.getpid(),
                segment=seg.name,
                segment_fd=seg.fd,
                doorbell_fd=doorbell_fd,
                name=name,
            ),
            timeout,
            on_completion,
        )
        assert isinstance(att, ctl.Attached)
        return att

    def request(
        self,
        make: Callable[[int], ctl.AnyRequest],
        timeout: float,
        on_completion: OnCompletion,
        check_alive: Callable[[], None] | None = None,
    ) -> ctl.AnyReply:
        """Send ``make(req_id)`` and return its reply; an ``Error`` reply raises.

        ``check_alive`` runs between receive slices and before a timeout is
        reported, so that a dead dataplane raises as such rather than as a slow
        one. Without it (while attaching, when nobody is known to be there yet)
        silence raises ``DataplaneUnavailable``.
        """
        self._req_id += 1
        rid = self._req_id
        self.sock.send(ctl.encoder.encode(make(rid)))
        deadline = time.monotonic() + timeout
        while rid not in self.replies:
            left = deadline - time.monotonic()
            if left <= 0:
                if check_alive is None:
                    raise DataplaneUnavailable(
                        f"no dataplane answered at {self.endpoint} within {timeout:g} s; is it "
                        "running? Start one with `duckpipe mock-dataplane` or `duckpipe dataplane`"
                    )
                check_alive()
                raise WaitTimeout(
                    f"the dataplane did not answer a control request within {timeout:g} s"
                )
            self.pump(min(left, BLOCK_SLICE_S), on_completion)
            if check_alive is not None and rid not in self.replies:
                check_alive()
        reply = self.replies.pop(rid)
        if isinstance(reply, ctl.Error):
            raise refused(reply.code, reply.message)
        return reply

    def pump(self, timeout_s: float, on_completion: OnCompletion, limit: int = 0) -> int:
        """Receive whatever the dataplane sent, waiting up to ``timeout_s`` for the first;
        at most ``limit`` messages (0: until none is left).

        Completions go to ``on_completion``; replies wait in ``replies`` for their
        request. Returns the number of messages received.
        """
        sock = self.sock
        if not zmq.zmq_poll(self._poll_items, int(timeout_s * 1000) if timeout_s > 0 else 0):
            return 0
        n = 0
        recv, decode, completion = sock.recv, ctl.reply_decoder.decode, ctl.Completion
        while not limit or n < limit:
            try:
                raw = recv(zmq.NOBLOCK)
            except zmq.Again:
                return n
            n += 1
            try:
                msg = decode(raw)
            except msgspec.DecodeError as e:
                self._counters["bad_messages"] += 1
                log.warning("undecodable message from the dataplane dropped: %s", e)
                continue
            if type(msg) is completion:  # the decoder makes exactly this type
                on_completion(msg)
            else:
                self.replies[msg.req_id] = msg
        return n

    def close(self) -> None:
        self.sock.close(linger=0)


def _check_endpoint(control: str) -> None:
    # A missing ipc socket file would otherwise show as an attach timeout, seconds later.
    if control.startswith("ipc://"):
        path = Path(control[len("ipc://") :])
        try:
            exists = path.exists()
        except PermissionError:
            parent = path.parent
            try:
                owner = f"uid {parent.stat().st_uid}, mode {parent.stat().st_mode & 0o777:o}"
            except OSError:
                owner = "an unreadable directory"
            raise DataplaneUnavailable(
                f"cannot look for the dataplane's socket {path}: permission denied on its "
                f"directory {parent} ({owner}; you are uid {os.geteuid()}). A dataplane "
                "serves the user who runs it: start your own (`duckpipe dataplane`), or "
                "point DUCKPIPE_CONTROL / DUCKPIPE_RUN_DIR at a directory you can read"
            ) from None
        if not exists:
            raise DataplaneUnavailable(
                f"no dataplane at {control} (no socket at {path}); is it running? Start one with "
                "`duckpipe mock-dataplane` or `duckpipe dataplane`, or set DUCKPIPE_CONTROL"
            )
