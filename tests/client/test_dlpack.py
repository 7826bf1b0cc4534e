"""Tensors the way torch users hold them: DLPack in and out of the client.

The protocol is checked twice: against numpy's own DLPack (a producer that is not an
ndarray; ``np.from_dlpack`` as the consumer) and against CPU torch, the framework MoE
teams hold their activations in. Views are checked as views (a write through one side is
seen through the other, data pointers equal), lifetimes by dropping one side and reading
the other, and the forwards against the numpy forward of the same values.
"""

from __future__ import annotations

import gc

import ml_dtypes
import numpy as np
import pytest

from duckpipe._abi import dlpack
from duckpipe.client.models import SwiGluMlp
from duckpipe.errors import BadInput
from duckpipe.moe import MoeMlp

torch = pytest.importorskip("torch")  # tools/setup installs the CPU build


class _Producer:
    """A DLPack producer that is not an ndarray: numpy's own export behind it."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


# --- the protocol -----------------------------------------------------------------------


def test_a_numpy_producer_comes_in_as_a_view():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    v = dlpack.as_array(_Producer(a))
    assert v.shape == (3, 4) and v.dtype == np.float32
    v[1, 2] = -7
    assert a[1, 2] == -7


def test_numpy_consumes_what_is_exported():
    a = np.arange(6, dtype=np.float16)
    b = np.from_dlpack(dlpack.Exported(a))
    assert b.__array_interface__["data"][0] == a.__array_interface__["data"][0]


@pytest.mark.parametrize(
    "tdtype, ndtype",
    [
        ("float32", np.float32),
        ("float16", np.float16),
        ("bfloat16", ml_dtypes.bfloat16),
        ("float8_e4m3fn", ml_dtypes.float8_e4m3fn),
        ("int64", np.int64),
        ("int32", np.int32),
    ],
)
def test_a_torch_tensor_comes_in_as_a_view_of_its_memory(tdtype, ndtype):
    t = torch.arange(12).reshape(3, 4).to(getattr(torch, tdtype))
    a = dlpack.as_array(t)
    assert a.dtype == np.dtype(ndtype) and a.shape == (3, 4)
    assert a.__array_interface__["data"][0] == t.data_ptr()
    np.testing.assert_array_equal(a.astype(np.float32), t.float().numpy())
    a[2, 3] = 1
    assert float(t[2, 3]) == 1.0


def test_strides_are_kept_and_a_transposed_tensor_is_read_as_it_is():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16).t()
    a = dlpack.as_array(t)
    assert a.shape == (4, 3)
    np.testing.assert_array_equal(a.astype(np.float32), t.float().numpy())


def test_the_tensor_outlives_its_owner_while_a_view_is_held():
    t = torch.full((1 << 16,), 3.0, dtype=torch.bfloat16)
    a = dlpack.as_array(t)
    del t
    gc.collect()
    torch.full((1 << 16,), 5.0, dtype=torch.bfloat16)  # would take the freed memory
    assert float(a.astype(np.float32).min()) == 3.0


def test_exported_bf16_is_a_torch_view_and_nothing_is_kept_after():
    a = np.arange(8, dtype=np.float32).astype(ml_dtypes.bfloat16)
    t = torch.from_dlpack(dlpack.Exported(a))
    assert t.dtype == torch.bfloat16 and t.data_ptr() == a.__array_interface__["data"][0]
    t[0] = 42
    assert float(a[0]) == 42.0
    del t
    unconsumed = dlpack.Exported(a).__dlpack__()
    del unconsumed
    gc.collect()
    assert not dlpack._exported  # each deleter ran: the consumer's and the unconsumed one's


def test_a_read_only_array_is_not_exported_as_a_writable_tensor():
    # a checkpoint's bf16 weight is a read-only view of a read-only map: a torch view of
    # it that could be written would crash the process on the first write. numpy's own
    # export refuses read-only arrays (the unversioned capsule cannot say so); so does ours
    a = np.zeros(8, dtype=ml_dtypes.bfloat16)
    a.flags.writeable = False
    with pytest.raises(BufferError, match="read-only"):
        dlpack.Exported(a).__dlpack__()
    assert not dlpack._exported


def test_strides_that_are_no_count_of_items_are_not_exported_wrong():
    # a bf16 view with a 3-byte stride: DLPack counts strides in items, and 3 // 2 would
    # hand the consumer other bytes than the array's
    raw = np.arange(16, dtype=np.uint8)
    a = np.ndarray((4,), dtype=ml_dtypes.bfloat16, buffer=raw, strides=(3,))
    with pytest.raises(BufferError, match="not multiples"):
        dlpack.Exported(a).__dlpack__()


def test_a_tensor_that_keeps_gradients_is_refused_with_the_producers_words():
    with pytest.raises(TypeError, match=r"require gradient, use tensor\.detach"):
        dlpack.as_array(torch.ones(2, requires_grad=True))


def test_torch_dtypes_name_numpy_dtypes():
    assert dlpack.from_torch_dtype(torch.bfloat16) == np.dtype(ml_dtypes.bfloat16)
    assert dlpack.from_torch_dtype(torch.float16) == np.float16
    assert dlpack.from_torch_dtype(np.float32) is np.float32


# --- the client -------------------------------------------------------------------------

HIDDEN, FFN = 64, 96


def assert_same_forward(got: np.ndarray, want: np.ndarray) -> None:
    """Two forwards of one input, equal but for the order of the sum: the dataplane adds
    the ducks' partials as they arrive, and the emulator's threads (like real ducks)
    answer in any order, so float32 sums may differ in their last bit, and a 2-byte
    result by one unit in its last place."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype.itemsize == 2:  # one unit in the last place of bf16 / float16
        rtol = 2.0**-7 if want.dtype == np.dtype(ml_dtypes.bfloat16) else 2.0**-10
    else:  # float32 sums of eight partials in another order
        rtol = 1e-5
    np.testing.assert_allclose(
        got.astype(np.float32), want.astype(np.float32), rtol=rtol, atol=1e-5
    )


@pytest.fixture(scope="module")
def dense(dataplane):
    import duckpipe

    with duckpipe.connect(dataplane.control, name="dlpack") as c:
        c.load_weights(601, SwiGluMlp.random(HIDDEN, FFN, seed=6))
        c.load_weights(602, SwiGluMlp.random(HIDDEN, FFN, seed=6, dtype=np.float16))
        c.load_weights(604, SwiGluMlp.random(HIDDEN, FFN, seed=6, dtype=ml_dtypes.bfloat16))
        yield c


@pytest.mark.parametrize("layer, tdtype", [(601, "float32"), (602, "float16"), (604, "bfloat16")])
def test_a_torch_forward_gives_a_torch_result_equal_to_the_numpy_one(dense, layer, tdtype):
    x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(1)).to(
        getattr(torch, tdtype)
    )
    y = dense.forward(layer, x)
    assert isinstance(y, torch.Tensor) and y.dtype == x.dtype and y.shape == x.shape
    want = dense.forward(layer, dlpack.as_array(x))  # numpy in (ml_dtypes for bf16)
    assert_same_forward(dlpack.as_array(y), want)


def test_a_bf16_slot_filled_through_torch(dense):
    x = torch.randn(2, HIDDEN, generator=torch.Generator().manual_seed(4)).bfloat16()
    with dense.claim((2, HIDDEN), torch.bfloat16) as slot:
        assert slot.array.dtype == np.dtype(ml_dtypes.bfloat16)
        torch.from_dlpack(slot).copy_(x)
        fwd = dense.submit(slot, 604)
    with fwd:
        y = torch.from_dlpack(fwd)
        assert y.dtype == torch.bfloat16
        assert_same_forward(dlpack.as_array(y), dense.forward(604, dlpack.as_array(x)))


def test_a_slot_and_a_result_are_torch_views(dense):
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(2))
    with dense.claim((3, HIDDEN), torch.float32) as slot:
        view = torch.from_dlpack(slot)
        assert view.data_ptr() == slot.array.__array_interface__["data"][0]
        view.copy_(x)  # written through torch, straight into shared memory
        fwd = dense.submit(slot, 601)
    with fwd:
        y = torch.from_dlpack(fwd)
        assert_same_forward(y.numpy(), dense.forward(601, x.numpy()))
        assert y.data_ptr() == fwd.result().__array_interface__["data"][0]


def test_an_empty_torch_batch_is_an_empty_torch_result(dense):
    y = dense.forward(601, torch.empty(0, HIDDEN))
    assert isinstance(y, torch.Tensor) and tuple(y.shape) == (0, HIDDEN)


def test_a_tensor_the_host_cannot_read_is_a_bad_input(dense):
    with pytest.raises(BadInput, match=r"^x: .*require gradient"):
        dense.forward(601, torch.ones(2, HIDDEN, requires_grad=True))


def test_routing_comes_as_torch_tensors_too(dataplane):
    import duckpipe

    moe = MoeMlp.random(8, HIDDEN, 32, shared=False, seed=8)
    x = np.random.default_rng(3).standard_normal((4, HIDDEN)).astype(np.float32)
    idx = np.array([[0, 3], [1, 2], [7, 6], [5, 4]], np.int64)
    w = np.array([[0.5, 0.25], [1.0, 2.0], [0.125, 1.5], [0.75, 0.5]], np.float32)
    with duckpipe.connect(dataplane.control, name="dlpack-moe") as c:
        c.load_weights(603, moe, ducks=list(range(4)))
        want = c.forward(603, x, routing=(idx, w))
        got = c.forward(
            603, torch.from_numpy(x), routing=(torch.from_numpy(idx), torch.from_numpy(w))
        )
        # a gate in bf16 gives bf16 weights (these are exact in bf16): taken as they are
        bf16 = c.forward(603, x, routing=(torch.from_numpy(idx), torch.from_numpy(w).bfloat16()))
    assert isinstance(got, torch.Tensor)
    assert_same_forward(got.numpy(), want)
    assert_same_forward(bf16, want)
