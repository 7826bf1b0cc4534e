"""The one source of truth: shared-memory ABI, wire header, control messages (and their
error codes), the dataplane's config and mixture-of-experts routing tables."""

from . import abi, config, control, routing, wire
from .layout import Layout, layout_of

__all__ = ["Layout", "abi", "config", "control", "layout_of", "routing", "wire"]
