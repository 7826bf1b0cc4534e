"""`duckpipe bench moe`'s shared-expert table at DeepSeek-V3's routing shape.

32 emulated ducks, hidden 7168, 256 experts top-8 chosen by ``Gate.deepseek_v3``, a
shared expert; experts narrowed (ffn 8, the shared one 32) so that the emulator computes
fast: what is measured is bytes on the wire per token against the minimum (each token's
row to each distinct duck that needs it: its routed ducks and the shared set), with the
shared expert on its default set and on every duck. Prints one markdown table.

    .venv/bin/python tools/moe_shared_shape.py          # about a minute on 2 cores
"""

import numpy as np

import duckpipe
from duckpipe import SwiGluMlp
from duckpipe.bench import moe as bm
from duckpipe.bench.common import Progress, Table
from duckpipe.bench.report import table_markdown
from duckpipe.demo.moe_shape import default_placement
from duckpipe.launch.cluster import Cluster
from duckpipe.moe import Gate, MoeMlp


def main() -> None:
    cfg = bm.Config(ducks=32, hidden=7168, expert_ffn=8, tokens=(), iters=8, warmup=2,
                    shared_tokens=(1, 8, 32, 64))  # fmt: skip
    base = MoeMlp.random(256, cfg.hidden, cfg.expert_ffn, shared=False, dtype=np.float16, seed=1)
    moe = MoeMlp(experts=base.experts, shared=SwiGluMlp.random(cfg.hidden, 32, np.float16, 9))
    every = MoeMlp(experts=moe.experts, shared=moe.shared, shared_ducks=list(range(32)))
    gate = Gate.deepseek_v3(cfg.hidden, seed=2)
    placement = default_placement(256, list(range(32)))
    rng = np.random.default_rng(3)

    def batch(t: int):
        x = rng.standard_normal((t, cfg.hidden), np.float32).astype(np.float16)
        i, w = gate(x)
        return x, i, w

    batches = {
        t: ([batch(t) for _ in range(cfg.warmup)], [batch(t) for _ in range(cfg.iters)])
        for t in cfg.shared_tokens
    }
    table = Table(key="moe_shared", title="moe_shared at DeepSeek-V3's shape",
                  columns=bm.SHARED_COLUMNS)  # fmt: skip
    prog = Progress("moe", 2 * len(cfg.shared_tokens), quiet=True)
    with Cluster(cfg.ducks, default_timeout_ms=10_000) as cl:
        with duckpipe.connect(cl.control, name="moe-shared-shape") as client:
            bm._measure_shared(client, cfg, prog, batches, placement, moe, every, table)
    print(table_markdown(table))


if __name__ == "__main__":
    main()
