"""The slot table: which of a client's slots are free, and each one's generation.

A slot goes free -> claimed (the client writes the activation) -> submitted (the
dataplane may read it and write the result) -> completed (the client reads the
result) -> free. Each claim bumps the slot's generation, so that a completion
meant for an earlier use of the slot is recognised and dropped.

``Slot`` is the public handle to a claimed slot; the table itself is the
client's private bookkeeping.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .errors import RingFull

if TYPE_CHECKING:
    from .client import Client

__all__ = ["Slot", "SlotState", "SlotTable"]


class SlotState(enum.IntEnum):
    FREE = 0
    CLAIMED = 1  # the client writes the activation
    SUBMITTED = 2  # the dataplane may read the activation and write the result
    COMPLETED = 3  # the client reads the result


class SlotTable:
    """The state and generation of every slot, and the free ones in reuse order."""

    __slots__ = ("free", "generation", "state")

    def __init__(self, count: int) -> None:
        self.generation = [0] * count
        self.state = [SlotState.FREE] * count
        self.free = list(range(count - 1, -1, -1))  # LIFO: slot 0 first, hottest reused

    def take(self, timeout: float, wait: Callable[[float], None]) -> int:
        """Claim a free slot and return its index.

        While none is free, ``wait(seconds_left)`` is called to take in the
        completions that free one; ``RingFull`` after ``timeout`` seconds.
        """
        if not self.free:
            deadline = time.monotonic() + timeout
            while not self.free:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RingFull(
                        f"all {len(self.state)} slots stayed in use for {timeout:g} s: "
                        "release finished forwards (Forward.release() or drop them), "
                        "or connect with more slots"
                    )
                wait(left)
        i = self.free.pop()
        # 32 bits, the done word's high half; never 0, which a done word not yet written holds
        self.generation[i] = (self.generation[i] + 1) & 0xFFFF_FFFF or 1
        self.state[i] = SlotState.CLAIMED
        return i

    def is_claimed(self, i: int, generation: int) -> bool:
        """Whether slot ``i`` is claimed, by the use ``generation`` names."""
        return self.state[i] == SlotState.CLAIMED and self.generation[i] == generation

    def release(self, i: int) -> None:
        self.state[i] = SlotState.FREE
        self.free.append(i)


class Slot:
    """A claimed slot. Write the activation into ``array`` (a view of shared memory).

    As a context manager it is released when the block raises, or when it ends
    without the slot having been submitted.
    """

    __slots__ = ("_client", "array", "generation", "index")

    def __init__(self, client: Client, index: int, generation: int, array: np.ndarray) -> None:
        self._client = client
        self.index = index
        self.generation = generation
        self.array = array

    def release(self) -> None:
        """Give the slot back without submitting it."""
        self._client._release_claim(self)

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._client._slot_is_claimed(self):
            self.release()

    def __repr__(self) -> str:
        return (
            f"<Slot {self.index} gen {self.generation} {self.array.dtype}{list(self.array.shape)}>"
        )
