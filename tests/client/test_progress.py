"""Weight-loading progress: it follows the ducks' acknowledgements, and draws ``\\r``
frames on a terminal only."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest

import duckpipe
from duckpipe.mock.process import MockDataplaneProcess
from duckpipe.progress import Progress
from duckpipe.testing import set_faults


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_forced_bar_on_a_log_file_writes_plain_lines_not_frames(monkeypatch):
    import duckpipe.progress as progress

    monkeypatch.setattr(progress, "LINE_INTERVAL_S", 0.01)
    log = io.StringIO()  # not a terminal
    with Progress(1000, "weights", enabled=True, stream=log) as bar:
        for _ in range(5):
            time.sleep(0.02)
            bar.advance(200)
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) >= 2 and "100.0%" in lines[-1]


def test_a_bar_on_a_terminal_redraws_in_place():
    tty = _Tty()
    with Progress(1000, "weights", stream=tty) as bar:
        bar.advance(500)
        bar.advance(500)
    assert tty.getvalue().startswith("\r") and tty.getvalue().count("\n") == 1


def test_no_bar_on_a_log_file_unless_asked():
    log = io.StringIO()
    with Progress(1000, "weights", stream=log) as bar:
        bar.advance(1000)
    assert log.getvalue() == ""


def test_load_progress_counts_acknowledged_bytes_not_copied_ones():
    mlp = duckpipe.GeluMlp.random(256, 1024, seed=3)
    total = sum(a.nbytes for a in (mlp.w_up, mlp.b_up, mlp.w_down, mlp.b_down))
    with MockDataplaneProcess(ducks=4) as dp:
        # every completion (a chunk's is sent once its ducks have acked) comes 0.2 s late
        set_faults(dp.control, delay_ms=200)
        calls = []
        with duckpipe.connect(dp.control, slot_size=64 << 10) as client:
            t0 = time.monotonic()
            client.load_weights(
                0, mlp, progress=lambda n, t: calls.append((time.monotonic(), n, t))
            )
            x = np.ones((1, 256), np.float32)
            with client.claim(x.shape, x.dtype) as slot:
                slot.array[:] = x
                fwd = client.submit(slot, 0)
            with fwd:
                np.testing.assert_allclose(fwd.result(), mlp.reference(x), rtol=1e-4, atol=1e-4)
    assert calls, "no progress reported"
    assert calls[0][0] - t0 >= 0.19  # nothing counted before the first acknowledgement
    assert [n for _, n, _ in calls] == sorted(n for _, n, _ in calls)
    assert calls[-1][1] == calls[-1][2] == total


@pytest.mark.dataplane  # starts the C programs itself
def test_a_load_onto_ducks_that_never_answer_stays_at_0_and_names_them(monkeypatch):
    """The topology names ducks 4-7, no duck runs there: the bar never moves (it went to
    100% on the failed chunks before), says which ducks it waits for, then which did not
    acknowledge; the load fails naming them."""
    from duckpipe.errors import LayerFailed
    from duckpipe.testing import assert_clean_exit, cluster_class_or_skip

    cl = cluster_class_or_skip()(8, groups=[(4, []), (4, [])], weight_timeout_ms=2500)
    cl.groups = cl.groups[:1]  # only ducks 0-3 run
    cl.start()
    tty = _Tty()
    monkeypatch.setattr("sys.stderr", tty)
    try:
        with duckpipe.connect(cl.control) as client:
            # at once: before the dataplane's PINGs call them unreachable (3 s)
            with pytest.raises(LayerFailed) as e:
                client.load_weights(
                    0, duckpipe.GeluMlp.random(256, 1024, seed=3), ducks=[4, 5, 6, 7], progress=True
                )
        assert e.value.missing == (4, 5, 6, 7)
    finally:
        assert_clean_exit(cl)
    frames = [f for f in tty.getvalue().split("\r") if f.strip()]
    assert frames and all("  0.0%" in f for f in frames), frames
    assert not any("100.0%" in f for f in frames)
    assert any(f.endswith("waiting for ducks [4, 5, 6, 7]\x1b[K") for f in frames), frames
    assert "ducks [4, 5, 6, 7] did not acknowledge" in frames[-1], frames[-1]
