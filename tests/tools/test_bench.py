"""``duckpipe bench`` at its tiniest sizes (``--smoke``): every row and column is there,
every number is finite, the markdown renders. Timings are never asserted."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from duckpipe.bench import SECTIONS, forward, forward_veth, ipc, pps
from duckpipe.bench.common import Size, Table, schedstat_ns, task_cpu_seconds
from duckpipe.bench.report import DocError, doc_sections, section_markdown, update_doc
from duckpipe.errors import DuckpipeError
from duckpipe.launch.binaries import find_binary

try:
    for _name in ("duckpipe-dataplane", "duckpipe-ducks", "duckpipe-floor"):
        find_binary(_name)
    MISSING = ""
except DuckpipeError as e:
    MISSING = str(e)

_skip_without_c = pytest.mark.skipif(
    bool(MISSING), reason=f"the C programs are not built: {MISSING}"
)


def needs_c(test):
    """A test that runs `duckpipe bench` sections which start the C programs."""
    return pytest.mark.dataplane(_skip_without_c(test))


ROOT = Path(__file__).resolve().parents[2]
TEXT_KEYS = {"config", "row", "name", "transport", "size", "series", "fit", "stream_delivered",
             "mode", "profile", "shared_set"}  # fmt: skip


def run_bench(
    tmp_path: Path, *args: str, hide_matplotlib: bool = False, size: str = "--smoke"
) -> tuple[str, dict]:
    out = tmp_path / "results"
    code = (
        "import sys; sys.modules['matplotlib'] = None; " if hide_matplotlib else ""
    ) + "from duckpipe.cli import main; raise SystemExit(main(sys.argv[1:]))"
    if not hide_matplotlib:
        code = "import sys; " + code
    p = subprocess.run(
        [sys.executable, "-c", code, "bench", *args, size, "--quiet", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
        check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout, json.loads((out / "bench.json").read_text())


def table(doc: dict, key: str) -> dict:
    (t,) = [t for t in doc["tables"] if t["key"] == key]
    return t


def assert_complete(t: dict) -> None:
    """Every row has every column, and every numeric cell is a finite number."""
    assert t["rows"], f"table {t['key']} is empty"
    for row in t["rows"]:
        for col in t["columns"]:
            k = col["key"]
            assert k in row, f"{t['key']}: row {row.get('name', row)} has no {k}"
            v = row[k]
            if k in TEXT_KEYS:
                assert isinstance(v, str) and v
            else:
                assert isinstance(v, int | float) and not isinstance(v, bool), (t["key"], k, v)
                assert math.isfinite(v), (t["key"], k, v)


def assert_markdown(stdout: str, title: str, columns: list[dict]) -> None:
    assert f"### {title}" in stdout
    header = "| " + " | ".join(c["heading"] for c in columns) + " |"
    lines = stdout.splitlines()
    i = lines.index(header)
    assert lines[i + 1].startswith("|---")
    assert lines[i + 2].startswith("| ") and lines[i + 2].count("|") == len(columns) + 1


@needs_c
@pytest.mark.slow  # 17-19 s: every section
def test_bench_all_smoke_has_every_row_column_and_machine_fact(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n\nkept as it is\n")
    stdout, doc = run_bench(tmp_path, "all", "--doc", str(page))
    for fact in ("cpu_model", "cpus", "kernel", "python", "numpy", "pinning", "date_utc"):
        assert doc["machine"].get(fact), fact
    assert doc["sections"] == ["ipc", "forward", "scale", "pps", "moe", "decode"]

    fwd = table(doc, "forward")
    assert_complete(fwd)
    cfgs, _, _ = forward.configs(Size("smoke"))
    names = set(forward.ROW_LABELS)
    got = {(r["config"], r["name"]) for r in fwd["rows"]}
    assert got == {(c.label, n) for c in cfgs for n in names}
    # `lost` is reported, not asserted: on a loaded machine wait=spin (client and dataplane
    # on one CPU) can miss a deadline, and that is a timing
    assert_markdown(stdout, fwd["title"], fwd["columns"])
    assert "other hardware" in stdout and "~546 µs" in stdout

    # over a veth: the socket backend beside the dpdk backend (af_xdp where it attaches)
    veth = table(doc, "forward_veth")
    why = forward_veth.unavailable()
    if why:
        assert veth["rows"] == [] and veth["notes"] == [f"skipped: {why}"]
    else:
        assert_complete(veth)
        names = [r["name"] for r in veth["rows"]]
        assert names[:2] == ["socket", "dpdk_af_packet"] and set(names) <= set(forward_veth.ROWS)
        assert len(names) == len(forward_veth.ROWS) or any(
            "net_af_xdp could not" in n for n in veth["notes"]
        )
        assert_markdown(stdout, veth["title"], veth["columns"])

    ipct = table(doc, "ipc")
    assert_complete(ipct)
    transports = {r["name"] for r in ipct["rows"]}
    assert {"numpy_copy", "pipe", "queue", "zmq_copy", "zmq_nocopy", "shm_ring"} <= transports
    assert {r["bytes"] for r in ipct["rows"]} == set(ipc.SIZES)
    # duckpipe's handoff: one row per way of waiting and size
    null = {(r["name"], r["bytes"]) for r in ipct["rows"] if r["name"].startswith("duckpipe")}
    modes = [p[1] for p in ipc.NULL_PROFILES]
    assert null == {(f"duckpipe_null_{m}", n) for m in modes for n in ipc.SIZES}
    assert_markdown(stdout, ipct["title"], ipct["columns"])
    assert all(f"mtu {ipc.NULL_MTU}" in r["transport"] for r in ipct["rows"] if r["name"] in
               {f"duckpipe_null_{m}" for m in modes})  # fmt: skip
    # what each way of waiting costs, busy and idle: a row per way, every column measured
    idle = table(doc, "ipc_idle")
    assert_complete(idle)
    assert [r["name"] for r in idle["rows"]] == [f"idle_{m}" for m in modes]
    assert all(r["idle_cpu_pct"] >= 0 and r["first_after_idle_us"] > 0 for r in idle["rows"])
    assert_markdown(stdout, idle["title"], idle["columns"])

    sc, fits = table(doc, "scale"), table(doc, "scale_fit")
    assert_complete(sc)
    assert_complete(fits)
    assert {r["series"] for r in sc["rows"]} == {"ducks", "payload"}
    assert len(fits["rows"]) in (2, 3)  # the third only with two points free of NACKs
    assert f"wrote {tmp_path / 'results' / 'bench.json'}" in stdout

    # pps: one row per frame size beside testpmd where root, DPDK and hugepages are here;
    # else the table says why it was skipped. Rates are reported, never asserted.
    pt = table(doc, "pps")
    why = pps.unavailable()
    if why:
        assert pt["rows"] == [] and pt["notes"] == [f"skipped: {why}"]
    else:
        assert_complete(pt)
        assert [r["name"] for r in pt["rows"]] == [n for n, _ in pps.FRAMES]
        assert [r["frame_bytes"] for r in pt["rows"]] == [122, 1514]
        for r in pt["rows"]:
            assert r["duckpipe_mpps"] > 0 and r["testpmd_mpps"] > 0
        assert_markdown(stdout, pt["title"], pt["columns"])

    # --doc: a block per section, in order, after the text that was there, each headed by
    # the date, the command and the machine, holding every table the run printed
    text = page.read_text()
    assert text.startswith("# Benchmarks\n\nkept as it is\n")
    blocks = doc_sections(text)
    assert list(blocks) == list(SECTIONS)
    facts = doc["machine"]
    for name, (start, end) in blocks.items():
        block = text[start:end]
        assert f"Measured {facts['date_utc']} by `duckpipe bench all" in block, name
        assert f"on {facts['cpu_model']}, {facts['cpus']} CPUs, kernel {facts['kernel']}" in block
        assert "(smoke size, " in block
    for t in doc["tables"]:
        assert f"### {t['title']}" in text, t["key"]
    assert f"wrote the ipc, forward, scale, pps, moe, decode section(s) of {page}" in stdout
    moe = table(doc, "moe")  # its rows: tests/tools/test_bench_moe.py
    assert [r["mode"] for r in moe["rows"]] == ["broadcast", "unicast", "dense"]
    assert_markdown(stdout, moe["title"], moe["columns"])
    decode = table(doc, "decode")  # its rows: tests/tools/test_bench_decode.py
    assert_complete(decode)


def test_bench_pps_says_why_it_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pps, "unavailable", lambda: "DPDK needs root (test)")
    (t,) = pps.run(Size("smoke"), quiet=True)
    assert t.rows == [] and t.notes == ["skipped: DPDK needs root (test)"]


@needs_c
def test_bench_forward_without_matplotlib_says_so_and_writes_no_plot(tmp_path: Path) -> None:
    stdout, doc = run_bench(tmp_path, "forward", hide_matplotlib=True)
    assert doc["sections"] == ["forward"]
    assert doc["plots"] == []
    assert "no plots: matplotlib is not installed" in stdout
    assert not list((tmp_path / "results").glob("*.png"))


@needs_c
def test_bench_scale_writes_plots_when_matplotlib_is_installed(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib (the bench extra) is not installed")
    _, doc = run_bench(tmp_path, "scale")
    assert sorted(doc["plots"]) == ["scale_ducks.png", "scale_payload.png"]
    for name in doc["plots"]:
        assert (tmp_path / "results" / name).stat().st_size > 0


def test_size_picks_by_name() -> None:
    assert Size("quick").pick(1, 2, 3) == 2
    assert Size("smoke").pick(1, 2, 3) == 3


# --- the page: --doc docs/benchmarks.md ---------------------------------------------------

FACTS = {"date_utc": "2026-01-02 03:04 UTC", "cpu_model": "Test CPU", "cpus": 2,
         "kernel": "6.1", "python": "3.11", "numpy": "2.0", "pinning": "none",
         "loadavg": [0.5, 0.4, 0.3], "git_commit": "abc1234", "size": "quick"}  # fmt: skip


def _block(name: str, value: int) -> str:
    t = Table(key=name, title=f"{name} table", columns=[("k", "k"), ("v", "v")])
    t.rows.append({"k": "row", "v": value})
    return section_markdown(name, FACTS, f"duckpipe bench {name}", 12.3, [t])


def test_a_section_block_says_when_what_and_where() -> None:
    block = _block("scale", 7)
    assert block.startswith("<!-- duckpipe bench: scale begin -->\n## scale\n")
    assert block.endswith("<!-- duckpipe bench: scale end -->")
    assert (
        "Measured 2026-01-02 03:04 UTC by `duckpipe bench scale` (quick size, 12 s) on Test "
        "CPU, 2 CPUs, kernel 6.1; Python 3.11, numpy 2.0; pinning: none; load average at the "
        "start 0.5, 0.4, 0.3; commit abc1234."
    ) in block
    assert "### scale table\n\n| k | v |\n|---|---|\n| row | 7 |" in block


def test_update_doc_starts_a_page_then_replaces_only_the_sections_that_ran(tmp_path) -> None:
    page = tmp_path / "docs" / "benchmarks.md"
    update_doc(page, {"ipc": _block("ipc", 1), "scale": _block("scale", 2)})
    first = page.read_text()
    assert first.startswith("# Benchmarks\n") and list(doc_sections(first)) == ["ipc", "scale"]
    page.write_text("intro by hand\n\n" + first + "\nnotes by hand\n")
    update_doc(page, {"scale": _block("scale", 3), "pps": _block("pps", 4)})
    text = page.read_text()
    assert text.startswith("intro by hand\n") and "notes by hand" in text
    assert list(doc_sections(text)) == ["ipc", "scale", "pps"]
    assert "| row | 1 |" in text and "| row | 3 |" in text and "| row | 4 |" in text
    assert "| row | 2 |" not in text
    assert text.index("notes by hand") < text.index("pps begin")  # a new section: at the end


@pytest.mark.parametrize(
    "text, why",
    [
        ("<!-- duckpipe bench: ipc begin -->\n", "no end marker"),
        ("<!-- duckpipe bench: ipc end -->\n", "without its begin marker"),
        (
            "<!-- duckpipe bench: ipc begin -->\n<!-- duckpipe bench: pps begin -->\n",
            "no end marker before 'pps' begins",
        ),
        ((_block("ipc", 1) + "\n") * 2, "appears twice"),
    ],
)
def test_doc_sections_refuses_markers_that_do_not_pair(text: str, why: str) -> None:
    with pytest.raises(DocError, match=why):
        doc_sections(text)


def test_bench_refuses_a_broken_page_before_it_measures_anything(tmp_path: Path) -> None:
    page = tmp_path / "broken.md"
    page.write_text("<!-- duckpipe bench: ipc begin -->\n")
    p = subprocess.run(
        [sys.executable, "-m", "duckpipe", "bench", "ipc", "--smoke", "--quiet",
         "--out", str(tmp_path / "out"), "--doc", str(page)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert p.returncode == 2, p.stdout + p.stderr
    assert "section 'ipc' has no end marker; fix its markers first" in p.stderr
    assert not (tmp_path / "out").exists()


def test_the_committed_benchmarks_page_has_a_block_per_section() -> None:
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert list(doc_sections(text)) == list(SECTIONS)
    assert "duckpipe bench all --doc docs/benchmarks.md" in text


# ------------------------------------------------- the commit a run records (issue 17, 16)


def test_the_commit_is_the_checkouts_head_else_the_wheels_else_says_neither(tmp_path, monkeypatch):
    import types

    from duckpipe.bench.common import PACKAGE_DIR, _git_commit

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=PACKAGE_DIR,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if head.returncode == 0:  # this checkout
        assert _git_commit() == head.stdout.strip()
    # a wheel installed in a venv that lies inside some other git checkout: not its commit
    other = tmp_path / "project"
    package = other / ".venv" / "lib" / "site-packages" / "duckpipe"
    package.mkdir(parents=True)
    for argv in (["init", "-q"], ["-c", "user.name=x", "-c", "user.email=x@x", "commit", "-q",
                                  "--allow-empty", "-m", "x"]):  # fmt: skip
        subprocess.run(["git", *argv], cwd=other, check=True, capture_output=True)
    built = types.ModuleType("duckpipe._build_info")
    built.GIT_COMMIT = "abc1234"
    monkeypatch.setitem(sys.modules, "duckpipe._build_info", built)
    assert _git_commit(package) == "abc1234 (the commit the installed package was built from)"
    built.GIT_COMMIT = ""  # built from a tree without git (an sdist)
    assert _git_commit(package).startswith("not a git checkout")
    assert _git_commit(tmp_path).startswith("not a git checkout")


def test_another_process_cpu_is_counted_in_nanoseconds_not_ticks():
    # the dataplane's CPU per forward: a quick run's few hundred forwards are tens of ms,
    # and /proc/<pid>/stat's 10 ms ticks (psutil's cpu_times) put its share anywhere
    # within +-10 ms. 4 ms of work must read as 4 ms, not 0 or 10
    before = task_cpu_seconds(os.getpid())
    end = time.thread_time() + 0.004
    while time.thread_time() < end:
        pass
    spent = task_cpu_seconds(os.getpid()) - before
    assert 0.0035 < spent < 0.009, spent


def test_one_threads_schedstat_is_its_own_and_the_process_sums_its_threads():
    # the one schedstat reader (the bench's and the tools'): a thread's ns on a CPU, or
    # every thread's; a thread that is not there reads as nothing, not an error
    import threading

    me = threading.get_native_id()
    on0, _ = schedstat_ns(os.getpid(), me)
    end = time.thread_time() + 0.004
    while time.thread_time() < end:
        pass
    on1, queued = schedstat_ns(os.getpid(), me)
    assert 3_500_000 < on1 - on0 < 9_000_000 and queued >= 0
    assert schedstat_ns("self")[0] >= on1
    assert schedstat_ns(os.getpid(), 2**31 - 1) == (0, 0)
