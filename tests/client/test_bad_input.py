"""Bad input from a user raises the documented errors, with messages that say what to do."""

from __future__ import annotations

import numpy as np
import pytest

import duckpipe
from duckpipe import GeluMlp
from duckpipe.errors import BadInput, ClientClosed, DuckpipeError, UnknownLayer
from duckpipe.schema.control import ErrorCode

HIDDEN = 32


@pytest.fixture
def loaded(client):
    client.load_weights(7, GeluMlp.random(HIDDEN, 64, seed=1), ducks=[0, 1, 2, 3])
    return client


def test_every_error_is_a_duckpipe_error():
    for name in duckpipe.errors.__all__:
        obj = getattr(duckpipe.errors, name)
        if name != "refused":
            assert issubclass(obj, DuckpipeError), name
    for code in ErrorCode:  # every refusal the dataplane can send, with its own message
        err = duckpipe.errors.refused(code, "why")
        assert isinstance(err, DuckpipeError) and "why" in str(err), code


def test_claim_rejects_unsupported_dtype(loaded):
    with pytest.raises(BadInput, match="int64 is not supported"):
        loaded.claim((1, HIDDEN), np.int64)


def test_submit_rejects_dtype_other_than_the_layers(loaded):
    with (
        loaded.claim((1, HIDDEN), np.float16) as slot,
        pytest.raises(BadInput, match="float32 weights"),
    ):
        loaded.submit(slot, 7)


def test_submit_rejects_wrong_hidden_size(loaded):
    with (
        loaded.claim((2, HIDDEN + 1), np.float32) as slot,
        pytest.raises(BadInput, match="hidden size 32"),
    ):
        loaded.submit(slot, 7)


@pytest.mark.parametrize("shape", [(), (0, HIDDEN), (1, 1, 1, 1, HIDDEN), (-1,), "abc"])
def test_claim_rejects_malformed_shapes(loaded, shape):
    with pytest.raises(BadInput):
        loaded.claim(shape, np.float32)


def test_claim_rejects_activation_larger_than_a_slot(loaded):
    rows = loaded.slot_size // (HIDDEN * 4) + 1
    with pytest.raises(BadInput, match="does not fit a slot"):
        loaded.claim((rows, HIDDEN), np.float32)


def test_claim_rejects_a_shape_whose_size_overflows_64_bits(loaded):
    # np.prod wrapped (2**32)**2 to 0 bytes; the claim then took a slot and failed to view it
    free_before = len(loaded._session.slots.free)
    for _ in range(2):
        with pytest.raises(BadInput, match="does not fit a slot"):
            loaded.claim((2**32, 2**32), np.float32)
    assert len(loaded._session.slots.free) == free_before


def test_claim_checks_a_shape_every_time_not_only_the_first(loaded):
    # claim remembers shapes that passed; one that failed must fail again, and an
    # unhashable shape (a list) works like the tuple
    for _ in range(2):
        with pytest.raises(BadInput, match="int64 is not supported"):
            loaded.claim((1, HIDDEN), np.int64)
        with pytest.raises(BadInput, match="positive dimensions"):
            loaded.claim([0, HIDDEN], np.float32)
        with loaded.claim([2, HIDDEN], "float32") as slot:
            assert slot.array.shape == (2, HIDDEN) and slot.array.dtype == np.float32


def test_a_layer_unloaded_or_reloaded_is_checked_again_at_submit(client):
    # submit reuses the descriptor it prepared for a layer, shape and dtype only while
    # the layer is the one it checked
    x = np.full((1, HIDDEN), 0.5, np.float32)
    mlp = GeluMlp.random(HIDDEN, 64, seed=3)
    client.load_weights(11, mlp, ducks=[0, 1])
    np.testing.assert_allclose(client.forward(11, x, timeout=10), mlp.reference(x), rtol=1e-5)
    client.unload_layer(11)
    with client.claim(x.shape, x.dtype) as slot, pytest.raises(UnknownLayer, match="layer 11"):
        client.submit(slot, 11)
    smaller = GeluMlp.random(HIDDEN // 2, 64, seed=4)
    client.load_weights(11, smaller, ducks=[2])
    with client.claim(x.shape, x.dtype) as slot, pytest.raises(BadInput, match="hidden size 16"):
        client.submit(slot, 11)
    y = x[:, : HIDDEN // 2]
    np.testing.assert_allclose(client.forward(11, y, timeout=10), smaller.reference(y), rtol=1e-5)


def test_submit_rejects_unknown_layer(loaded):
    with (
        loaded.claim((1, HIDDEN), np.float32) as slot,
        pytest.raises(UnknownLayer, match="layer 999 is not loaded"),
    ):
        loaded.submit(slot, 999)


def test_submit_rejects_ducks_that_hold_no_shard(loaded):
    with (
        loaded.claim((1, HIDDEN), np.float32) as slot,
        pytest.raises(BadInput, match=r"ducks \[9\]"),
    ):
        loaded.submit(slot, 7, ducks=[1, 9])


def test_a_slot_cannot_be_submitted_twice_or_after_release(loaded):
    slot = loaded.claim((1, HIDDEN), np.float32)
    fwd = loaded.submit(slot, 7)
    with pytest.raises(BadInput, match="not claimed"):
        loaded.submit(slot, 7)
    fwd.result(timeout=10)
    other = loaded.claim((1, HIDDEN), np.float32)
    other.release()
    with pytest.raises(BadInput, match="not claimed"):
        loaded.submit(other, 7)


def test_slot_context_manager_releases_on_error(loaded):
    free_before = len(loaded._session.slots.free)
    with pytest.raises(RuntimeError), loaded.claim((1, HIDDEN), np.float32):
        assert len(loaded._session.slots.free) == free_before - 1
        raise RuntimeError("model code failed")
    assert len(loaded._session.slots.free) == free_before


def test_released_forward_refuses_to_hand_out_its_reused_slot(loaded):
    with loaded.claim((1, HIDDEN), np.float32) as slot:
        slot.array[:] = 1
        fwd = loaded.submit(slot, 7)
    fwd.result(timeout=10)
    fwd.release()
    with pytest.raises(BadInput, match="released"):
        fwd.result()


def test_closed_client_raises_client_closed(dataplane):
    c = duckpipe.connect(dataplane.control)
    c.load_weights(8, GeluMlp.random(HIDDEN, 64, seed=2), ducks=[0])
    slot = c.claim((1, HIDDEN), np.float32)
    fwd = c.submit(slot, 8)
    c.close()
    c.close()  # idempotent
    for call in (
        lambda: c.claim((1, HIDDEN)),
        lambda: c.submit(slot, 8),
        lambda: fwd.result(1),
        c.stats,
    ):
        with pytest.raises(ClientClosed, match="connect again"):
            call()


def test_connect_rejects_bad_options(dataplane):
    with pytest.raises(BadInput, match="power of two"):
        duckpipe.connect(dataplane.control, slots=3)
    with pytest.raises(BadInput, match="wait must be"):
        duckpipe.connect(dataplane.control, wait="sleepy")


def test_connect_refuses_a_forward_timeout_above_the_dataplanes_limit(dataplane):
    # the dataplane would refuse every forward (BAD_REQUEST); its limit is the default 10 s
    with pytest.raises(BadInput, match=r"forward_timeout=10\.5 s is above this dataplane's "
                       r"max_timeout_us \(10000000 us = 10 s\)"):  # fmt: skip
        duckpipe.connect(dataplane.control, forward_timeout=10.5)
    with duckpipe.connect(dataplane.control, forward_timeout=10.0) as c:  # at it: fine
        c.load_weights(1, GeluMlp.random(8, 64), ducks=[0, 1])
        assert c.forward(1, np.ones((1, 8), np.float32)).shape == (1, 8)
        # the refused client detached: only this one is left
        assert [x.client_id for x in c.stats().clients] == [c.client_id]


def test_load_weights_rejects_unknown_ducks_and_too_many_shards(client):
    mlp = GeluMlp.random(8, 4, seed=3)
    with pytest.raises(BadInput, match="distinct ids"):
        client.load_weights(9, mlp, ducks=[0, 0])
    with pytest.raises(BadInput, match="distinct ids"):
        client.load_weights(9, mlp, ducks=[500])
    with pytest.raises(BadInput, match="cannot shard an FFN of 4 columns over 5 ducks"):
        client.load_weights(9, mlp, ducks=[0, 1, 2, 3, 4])


def test_load_weights_of_a_bare_array_says_a_layer_is_a_model_and_which_dtypes(client):
    # not "dtype float64 is not supported": the array's dtype is not what is wrong
    with pytest.raises(BadInput) as e:
        client.load_weights(2, np.ones((3, 3)))
    msg = str(e.value)
    assert "not a numpy array of shape (3, 3)" in msg and "duckpipe.GeluMlp(w_up=" in msg
    assert "float32, float16 or bfloat16" in msg and "is not supported" not in msg


def test_a_model_of_float64_tensors_names_the_tensor_and_the_dtypes():
    with pytest.raises(
        BadInput, match=r"GeluMlp\.w_up is float64; the ducks compute float32, float16 or bfloat16"
    ):
        GeluMlp.random(8, 16, dtype=np.float64)


def test_mlp_rejects_mismatched_shapes():
    w = np.zeros((8, 16), np.float32)
    with pytest.raises(BadInput, match="w_down has shape"):
        GeluMlp(w_up=w, b_up=np.zeros(16, np.float32), w_down=np.zeros((8, 16), np.float32))
