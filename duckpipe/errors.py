"""One exception family. Every message says what happened and what to do about it."""

from __future__ import annotations

__all__ = [
    "AbiMismatch",
    "BadInput",
    "Cancelled",
    "ClientClosed",
    "ClientDetached",
    "DataplaneFault",
    "DataplaneLost",
    "DataplaneRefused",
    "DataplaneUnavailable",
    "DuckLost",
    "DuckpipeError",
    "ForwardFailed",
    "ForwardTimeout",
    "RingFull",
    "SegmentError",
    "StaleEpoch",
    "UnknownLayer",
    "WaitTimeout",
]


class DuckpipeError(Exception):
    """Base of every error duckpipe raises."""


class BadInput(DuckpipeError, ValueError):
    """An argument is wrong (dtype, shape, size, layer, duck ids...)."""


class UnknownLayer(BadInput, KeyError):
    """The dataplane holds no weights for that layer."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class ClientClosed(DuckpipeError):
    """The client was closed; connect again."""


class ClientDetached(DuckpipeError, ConnectionError):
    """The dataplane detached this client on its own (the segment header says why)."""


class RingFull(DuckpipeError):
    """No free slot within the timeout: the dataplane lags, or results are not released."""


class WaitTimeout(DuckpipeError, TimeoutError):
    """Our wait ended before the completion arrived; the forward is still pending."""


class DataplaneUnavailable(DuckpipeError, ConnectionError):
    """No dataplane answered at the control address."""


class DataplaneLost(DuckpipeError, ConnectionError):
    """The dataplane died or stopped heartbeating; pending forwards are lost."""


class DataplaneRefused(DuckpipeError):
    """The dataplane answered a control request with an error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{message} [{code}]")
        self.code = code


class AbiMismatch(DuckpipeError):
    """A segment or peer speaks another major version of the ABI."""


class SegmentError(DuckpipeError, OSError):
    """A shared-memory segment could not be created, opened or mapped."""


class ForwardFailed(DuckpipeError):
    """The dataplane completed the forward with a status other than OK."""

    def __init__(self, message: str, *, status: int, missing: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.missing = missing


class ForwardTimeout(ForwardFailed, TimeoutError):
    """The forward's deadline passed; ``missing`` names the ducks that did not answer."""


class DuckLost(ForwardFailed):
    """A targeted duck is known dead."""


class StaleEpoch(ForwardFailed):
    """The forward was submitted under an epoch the dataplane has left; submit it again."""


class Cancelled(ForwardFailed):
    """The forward was cancelled."""


class DataplaneFault(ForwardFailed):
    """The dataplane refused or failed the forward (bad request or internal error)."""
