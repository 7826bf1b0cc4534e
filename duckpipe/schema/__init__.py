"""The one source of truth: shared-memory ABI, wire header and control messages."""

from . import abi, control, wire
from .layout import Layout, layout_of

__all__ = ["Layout", "abi", "control", "layout_of", "wire"]
