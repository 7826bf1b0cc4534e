"""One exception family. Every message says what happened and what to do about it."""

from __future__ import annotations

from .schema.control import ErrorCode

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
    "DucksUnreachable",
    "ForwardFailed",
    "ForwardTimeout",
    "LayerFailed",
    "NotPermitted",
    "QuotaExceeded",
    "RingFull",
    "SegmentError",
    "StaleEpoch",
    "UnknownLayer",
    "WaitTimeout",
    "refused",
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

    def __init__(self, code: ErrorCode | int, message: str) -> None:
        try:
            code = ErrorCode(code)
            name = code.name.lower()
        except ValueError:  # a newer dataplane's code: still say which
            name = f"error {code}"
        super().__init__(f"{message} [{name}]")
        self.code = code


class NotPermitted(DataplaneRefused, PermissionError):
    """The request needs the admin role (the user who started the dataplane), or touches
    another client's layer or segment."""


class QuotaExceeded(DataplaneRefused):
    """The client's layer or weight-byte quota (dataplane config) would be passed;
    unload layers it no longer needs."""


class DucksUnreachable(DataplaneRefused, ConnectionError):
    """A weight load names ducks the dataplane knows are dead (silent for its last 3
    pings): it was refused before anything was sent. Start them, or load onto others."""


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


class LayerFailed(DataplaneFault):
    """A layer's weight load failed: ``missing`` names the ducks that did not acknowledge
    their weights. The layer stays unusable (forwards on it raise this too) until
    ``load_weights`` of the same layer succeeds."""


#: One table: the exception an Error reply with this code raises (DataplaneRefused otherwise).
_REFUSALS: dict[ErrorCode, type[DuckpipeError]] = {
    ErrorCode.BAD_REQUEST: BadInput,
    ErrorCode.UNKNOWN_LAYER: UnknownLayer,
    ErrorCode.ABI_MISMATCH: AbiMismatch,
    ErrorCode.BAD_SEGMENT: SegmentError,
    ErrorCode.NOT_PERMITTED: NotPermitted,
    ErrorCode.QUOTA_EXCEEDED: QuotaExceeded,
    ErrorCode.DUCKS_UNREACHABLE: DucksUnreachable,
}


def refused(code: ErrorCode | int, message: str) -> DuckpipeError:
    """The exception for a dataplane's Error reply."""
    cls = _REFUSALS.get(code)  # type: ignore[call-overload]
    if cls is None or issubclass(cls, DataplaneRefused):
        return (cls or DataplaneRefused)(code, message)
    return cls(message)
