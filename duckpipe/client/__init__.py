"""The client side: attach to a dataplane, claim slots, submit forwards, load weights.

``api`` is the public face (Client, Forward, Slot, connect); ``session`` the package-internal
seam they share (segment, ring, slot table, in flight, channel); ``slots``, ``channel`` and
``weights`` its parts, over the segment and ring of ``duckpipe._abi`` (which the mock
dataplane shares); ``models`` the MLP kinds and their numpy reference.
"""

from .api import Client, Forward, Slot, WaitStrategy, connect

__all__ = ["Client", "Forward", "Slot", "WaitStrategy", "connect"]
