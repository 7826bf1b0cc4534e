"""The fuzz build as documented, and what CI's fuzz pass runs (issue 27, point 6).

The documented command (docs/contributing.md, docs/security.md) is CI's: tools/setup's
fuzz pass sets up dataplane/build-fuzz with the same options (and -Dwerror) and compiles
everything in it before it runs the harnesses, so clang-16 meets every file (a GCC-only
builtin in dp_dpdk_cksum.h once broke that build where DPDK is installed, unseen, as CI
compiled the harnesses alone). The compile itself is CI's (about 20 s beyond the
harnesses on 2 cores); these tests pin the commands and the harness options cheaply.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

from duckpipe.schema.abi import MAX_DUCKS
from duckpipe.schema.routing import MAX_TOKENS, MAX_TOPK

ROOT = Path(__file__).resolve().parents[2]
FUZZ = ROOT / "dataplane" / "fuzz"
SETUP = ROOT / "tools" / "setup"


def _documented_setups() -> list[list[str]]:
    """Each documented `meson setup` of build-fuzz, as argv (the env assignment first)."""
    found = []
    for doc in ("docs/contributing.md", "docs/security.md"):
        for line in (ROOT / doc).read_text().splitlines():
            if "meson setup dataplane/build-fuzz" in line:
                found.append(shlex.split(line.split("#", 1)[0]))
    assert len(found) == 2, found
    return found


def _fuzz_pass() -> str:
    text = SETUP.read_text()
    return re.search(r"^fuzz_run\(\) \{\n(.*?)^\}", text, re.S | re.M).group(1)


def test_ci_fuzz_pass_sets_up_the_documented_build_and_compiles_all_of_it():
    body = [line.strip() for line in _fuzz_pass().splitlines() if not line.strip().startswith("#")]
    setup = next(line for line in body if "c_setup dataplane/build-fuzz" in line)
    ci = shlex.split(setup)
    # c_setup adds these two to every build dir (tools/setup)
    ci_opts = set(ci[ci.index("dataplane/build-fuzz") + 1 :]) | {"-Dpython_module=false"}
    for argv in _documented_setups():
        assert argv[0] == ci[0] == "CC=clang-16", (argv, ci)
        doc_opts = set(argv[argv.index("dataplane/build-fuzz") + 1 :])
        assert doc_opts == ci_opts, (doc_opts, ci_opts)
    # everything compiled (c_build with no target), and before the harnesses run
    compile_all = body.index("c_build dataplane/build-fuzz")
    run = next(i for i, line in enumerate(body) if line.endswith("fuzz-run"))
    assert body.index(setup) < compile_all < run, body


def _options(harness: str) -> list[str]:
    return [
        line
        for line in (FUZZ / f"{harness}.options").read_text().splitlines()
        if not line.startswith("#")
    ]


def test_fuzz_routing_may_grow_an_input_to_the_largest_valid_table():
    # 8 bytes of parameters (fuzz_routing.c), then a host table (16-byte header, 8 bytes
    # an entry) or a wire table (16-byte header, 8 bytes a section, 8 an entry)
    host = 16 + MAX_TOKENS * MAX_TOPK * 8
    wire = 16 + 8 * (MAX_DUCKS + MAX_TOKENS * MAX_TOPK)
    largest = 8 + max(host, wire)
    lens = [int(o.split("=", 1)[1]) for o in _options("fuzz_routing") if o.startswith("-max_len=")]
    assert lens and lens[0] >= largest, (lens, largest)
    assert lens[0] <= 2 * largest  # not a cap in name only: libFuzzer sizes its buffers by it


def test_run_sh_hands_each_harness_its_options_one_argument_a_line(tmp_path):
    # a stand-in harness by the name: it writes down the arguments run.sh gives it
    for harness in ("fuzz_routing", "fuzz_control"):
        fake = tmp_path / harness
        fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "[%s]\\n" "$a"; done\n')
        fake.chmod(0o755)
        out = tmp_path / "out"
        r = subprocess.run(
            [str(FUZZ / "run.sh"), str(out), str(fake)],
            env=dict(os.environ, FUZZ_SECONDS="1"),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        given = (out / f"{harness}.log").read_text().splitlines()
        for option in _options(harness):
            assert f"[{option}]" in given, (option, given)
        assert "[]" not in given, given  # no blank line taken for a corpus dir
        assert f"[fuzz/corpus/{harness}]" in given and "[-max_total_time=1]" in given, given
