"""duckpipe: offload a model's MLP layers to a cluster of networked compute nodes (ducks).

import duckpipe
with duckpipe.connect() as client:
    client.load_weights(0, duckpipe.GeluMlp.random(384, 1536))
    with client.claim((4, 384), "float32") as slot:
        slot.array[:] = x                   # written once, straight into shared memory
        fwd = client.submit(slot, layer=0)
    y = fwd.result()                        # a view of the result slot
"""

from . import errors
from .client.api import Client, Forward, Slot, WaitStrategy, connect
from .client.models import GeluMlp, SwiGluMlp
from .errors import DuckpipeError
from .moe import MoeMlp
from .schema.abi import DType, MlpKind, Status

__version__ = "0.1.0"

__all__ = [
    "Client",
    "DType",
    "DuckpipeError",
    "Forward",
    "GeluMlp",
    "MlpKind",
    "MoeMlp",
    "Slot",
    "Status",
    "SwiGluMlp",
    "WaitStrategy",
    "__version__",
    "connect",
    "errors",
]
