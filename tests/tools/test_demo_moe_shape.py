"""The MoE demo's pure parts (duckpipe/demo/moe_shape.py): the layer matches DeepSeek-V3's
shape and gate, the placement and the ducks a token reaches, and the report's text from
made-up numbers (the timed run itself is tests/e2e/test_demo_moe.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from duckpipe.cli import _parser
from duckpipe.demo import moe_shape as ms


def test_the_layer_is_deepseek_v3s_shape_read_back_from_its_fp8_checkpoint(tmp_path):
    said: list[str] = []
    shape = ms.MoeShape(cache=tmp_path, hidden=64, seed=3, say=said.append)
    g = shape.gate
    assert (g.n_experts, g.hidden, g.topk, g.groups, g.topk_groups) == (256, 64, 8, 8, 4)
    assert g.score == "sigmoid" and g.bias is not None and g.route_scale == 2.5
    assert g.weight.dtype == ml_dtypes.bfloat16  # as DeepSeek-V3's checkpoint holds it
    moe = shape.moe
    assert moe.n_experts == 256 and moe.ffn == ms.EXPERT_FFN
    assert all(e.weight_dtype == np.dtype(ml_dtypes.float8_e4m3fn) for e in moe.experts)
    assert moe.shared is not None and moe.shared.ffn == ms.SHARED_FFN
    # one byte a weight, and a float32 scale per 128 x 128 block (one here: hidden 64)
    assert shape.weight_bytes == 257 * 3 * (64 * 128 + 4)
    assert any("wrote" in s and "GB" in s for s in said)
    # written once: the same arguments read the cache, the same layer and batches again
    said.clear()
    again = ms.MoeShape(cache=tmp_path, hidden=64, seed=3, say=said.append)
    assert any("cached" in s for s in said) and again.folder == shape.folder
    assert np.array_equal(again.moe.experts[17].w_up, moe.experts[17].w_up)
    other = ms.MoeShape(cache=tmp_path, hidden=64, seed=4)
    assert other.folder != shape.folder
    assert not np.array_equal(other.moe.experts[17].w_up, moe.experts[17].w_up)
    x, indices, weights = shape.batch(8, 0)
    x2, indices2, _ = again.batch(8, 0)
    assert x.dtype == ml_dtypes.bfloat16 and x.shape == (8, 64) and np.array_equal(x, x2)
    assert indices.shape == (8, 8) and np.array_equal(indices, indices2)
    np.testing.assert_allclose(weights.sum(axis=1), 2.5, rtol=1e-5)  # route scale
    assert not np.array_equal(shape.batch(8, 1)[0], x)
    assert shape.moe.reference(x, indices, weights).shape == (8, 64)


def test_an_interrupted_checkpoint_is_written_again(tmp_path):
    first = ms.MoeShape(cache=tmp_path, hidden=64, seed=5)
    (first.folder / "complete").unlink()  # as if the write had stopped before its end
    (first.folder / "config.json").write_text("{")
    said: list[str] = []
    again = ms.MoeShape(cache=tmp_path, hidden=64, seed=5, say=said.append)
    assert any("wrote" in s for s in said)
    assert np.array_equal(again.moe.experts[3].w_gate, first.moe.experts[3].w_gate)


def test_the_quantization_is_deepseeks_each_block_filling_e4m3s_range():
    from duckpipe.demo.moe_checkpoint import quantize

    w = np.random.default_rng(1).standard_normal((200, 300)).astype(np.float32)
    q, s = quantize(w)
    assert q.dtype == ml_dtypes.float8_e4m3fn and s.shape == (2, 3) and s.dtype == np.float32
    assert float(np.abs(q[:128, :128].astype(np.float32)).max()) == 448.0
    grid = np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[:200, :300]
    back = q.astype(np.float32) * grid  # weight_dequant
    assert float(np.abs(back - w).max()) <= float(np.abs(w).max()) * 2.0**-3


def test_the_default_placement_puts_8_experts_on_each_of_32_ducks():
    p = ms.default_placement(256, list(range(32)))
    assert p[:9] == [0] * 8 + [1] and p[-1] == 31
    assert np.bincount(p).tolist() == [8] * 32
    assert ms.default_placement(256, [5, 9])[127:129] == [5, 9]  # the ducks given, in order


def test_routed_ducks_counts_distinct_ducks_per_token():
    placement = ms.default_placement(16, [0, 1, 2, 3])  # 4 experts per duck
    indices = np.array([[0, 1, 2, 3], [0, 4, 8, 12], [3, 7, 4, 5]])
    assert ms.routed_ducks(indices, placement).tolist() == [1, 4, 2]


def test_relative_error_is_against_the_largest_reference_value():
    want = np.array([[4.0, -2.0]], ml_dtypes.bfloat16)
    assert ms.relative_error(np.array([[4.0, -1.0]], ml_dtypes.bfloat16), want) == 0.25


def _report(tokens: int, err: float = 1e-4) -> ms.BatchReport:
    return ms.BatchReport(
        tokens=tokens, calls=20, routed_ducks_per_token=6.5, measured_ducks_per_token=6.5,
        expert_rows_per_token=8.0, ducks_per_call=6.5 * tokens / (1 + tokens / 8),
        wire_bytes_per_token=14400.0 + tokens, p50_us=1000.0 * tokens, p99_us=1500.0 * tokens,
        host_overhead_p50_us=80.0, host_overhead_p99_us=120.0,
        duck_compute_p50_us=700.0 * tokens, max_rel_error=err,
    )  # fmt: skip


def test_the_report_has_a_column_per_batch_size_and_says_pass():
    text = ms.format_report([_report(t) for t in ms.BATCHES], ducks=32, hidden=7168,
                            layer_bytes=1_414_791_168)  # fmt: skip
    lines = text.splitlines()
    assert "hidden 7168, 256 routed experts" in text and "32 ducks, 8 experts each" in text
    assert "1.41 GB" in text
    heading = next(ln for ln in lines if ln.startswith("  tokens per call"))
    assert heading.split() == ["tokens", "per", "call", "1", "8", "32"]
    row = {ln[:28].strip(): ln[28:].split() for ln in lines if ln.startswith("  ")}
    assert row["routed ducks / token"] == ["6.50"] * 3
    assert row["wire bytes / token"] == ["14,401", "14,408", "14,432"]
    assert row["p50 per call (us)"] == ["1000", "8000", "32000"]
    assert row["tokens/s, this layer"] == ["1000"] * 3  # tokens / p50
    assert row["check"] == ["PASS"] * 3
    assert "the shared expert's ducks (its default set, shared_ducks) compute every token" in text
    assert "16.17 tokens/s" in text and "other hardware" in text and "not this run" in text
    assert lines[-1] == "PASS: largest relative difference from MoeMlp.reference 1.00e-04 " \
        "<= tolerance 2e-02"  # fmt: skip


def test_one_batch_over_the_tolerance_fails_the_run_and_missing_stats_show_a_dash():
    bad = _report(8, err=0.2)
    bad.measured_ducks_per_token = bad.expert_rows_per_token = bad.wire_bytes_per_token = None
    reports = [_report(1), bad, _report(32)]
    assert not ms.passed(reports, ms.TOLERANCE) and ms.passed(reports, 0.5)
    text = ms.format_report(reports, ducks=8, hidden=512, layer_bytes=1)
    row = {ln[:28].strip(): ln[28:].split() for ln in text.splitlines() if ln.startswith("  ")}
    assert row["check"] == ["PASS", "FAIL", "PASS"]
    assert row["wire bytes / token"][1] == "-" and row["ducks computing / token"][1] == "-"
    assert text.splitlines()[-1].startswith("FAIL: largest relative difference")
    assert "8 ducks, 32 experts each" in text
    assert not ms.passed([], 1.0)


def test_the_demo_takes_the_moe_model_and_its_options():
    args = _parser().parse_args(
        ["demo", "--model", "deepseek-v3-moe-shape", "--ducks", "8", "--hidden", "512",
         "--calls", "3"]
    )  # fmt: skip
    assert (args.model, args.ducks, args.hidden, args.calls) == ("deepseek-v3-moe-shape", 8,
                                                                 512, 3)  # fmt: skip
    d = _parser().parse_args(["demo", "--model", "deepseek-v3-moe-shape"])
    assert d.ducks is None and d.hidden == 7168  # run() makes ducks 32


@pytest.mark.parametrize("bad", [["--hidden", "0"], ["--calls", "0"]])
def test_the_demo_refuses_a_zero_size_before_it_starts_anything(bad, capsys):
    from duckpipe.cli import main

    assert main(["demo", "--model", "deepseek-v3-moe-shape", *bad, "--control",
                 "ipc:///nonexistent/control"]) == 1  # fmt: skip
    assert "--hidden and --calls must be >= 1" in capsys.readouterr().err


def test_the_reference_cluster_is_cited_from_a_page_in_the_repository():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    text = ms.format_report([_report(t) for t in ms.BATCHES], ducks=32, hidden=7168,
                            layer_bytes=1)  # fmt: skip
    cited = re.findall(r"[\w./-]+\.md", text) + re.findall(r"[\w./-]+\.md", ms.__doc__ or "")
    assert cited, "the report says where its reference figure comes from"
    for page in cited:
        assert (root / page).is_file(), f"{page} is cited but not in the repository"
    # and that page holds the figure the report prints
    assert (
        f"{ms.REFERENCE_DECODE_TOKENS_PER_S} tokens/s" in (root / "docs/benchmarks.md").read_text()
    )
