"""The one source of truth: shared-memory ABI, wire header, control messages (and their
error codes) and the dataplane's config."""

from . import abi, config, control, wire
from .layout import Layout, layout_of

__all__ = ["Layout", "abi", "config", "control", "layout_of", "wire"]
