"""duckpipe's demo: a real sentence-embedding model whose FFNs run on the ducks.

The model lives in ``duckpipe.demo.minilm``; import it from there. This package
imports nothing itself, so ``import duckpipe.demo`` stays cheap and works without
the model's optional packages installed.
"""

from __future__ import annotations

__all__: list[str] = []
