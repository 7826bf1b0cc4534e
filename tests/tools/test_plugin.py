"""The pytest plugin (duckpipe.testing.plugin) and its helpers (duckpipe.testing) as a
user meets them: fixtures with docstrings, the fixture object accepted by connect(), a
ready client, the README's example, the helpers without pytest, a run without warnings."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import duckpipe
from duckpipe.testing import cluster_class_or_skip

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    # the subprocess imports this checkout's duckpipe, whichever one is installed
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_pytest_fixtures_shows_a_docstring_for_every_duckpipe_fixture(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--fixtures", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    section = out.split("fixtures defined from duckpipe.testing", 1)[1].split("\n---", 1)[0]
    names = re.findall(r"^(duckpipe_\w+)", section, re.M)
    assert {"duckpipe_mock", "duckpipe_client", "duckpipe_mock_factory"} <= set(names), section
    assert "no docstring available" not in section, section


def test_the_helpers_import_in_a_script_without_pytest():
    # pytest made unimportable, as where it is not installed: the helpers still work
    code = (
        "import sys\n"
        "sys.modules['pytest'] = None\n"
        "import numpy as np\n"
        "from duckpipe.testing import null_backend_result, null_topology, set_faults\n"
        "print(null_backend_result(np.full(2, 0.5, np.float32), ducks=3).tolist())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0 and r.stdout == "[1.5, 1.5]\n", r.stderr
    # and importing them does not import pytest where it is installed
    code = "import sys, duckpipe.testing; print('pytest' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.stdout == "False\n", r.stdout + r.stderr


def test_a_users_pytest_run_in_a_fresh_dir_shows_no_assertion_rewrite_warning(tmp_path):
    # a user's own project: no pyproject (so none of this repository's warning filters)
    (tmp_path / "test_mine.py").write_text(
        "def test_it(duckpipe_client):\n    assert duckpipe_client.topology().ducks\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed" in r.stdout and "warning" not in r.stdout.lower(), (
        f"{r.stdout}\n(an editable install made before tools/setup installed "
        "tools/duckpipe-pytest.pth warns: run tools/setup env again)"
    )


def test_connect_accepts_the_fixture_object(duckpipe_mock):
    with duckpipe.connect(duckpipe_mock) as client:
        assert client.control == duckpipe_mock.control
        assert len(client.topology().ducks) == 8


def test_connect_says_what_to_pass_for_anything_else():
    with pytest.raises(duckpipe.errors.BadInput, match=r"\.control address"):
        duckpipe.connect(42)  # type: ignore[arg-type]


def test_duckpipe_client_is_connected_and_computes(duckpipe_client):
    mlp = duckpipe.GeluMlp.random(32, 64)
    duckpipe_client.load_weights(7, mlp)
    x = np.ones((2, 32), np.float32)
    np.testing.assert_allclose(
        duckpipe_client.forward(7, x), mlp.reference(x), rtol=1e-4, atol=1e-4
    )


def _readme_example() -> str:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    found = [b for b in blocks if b.startswith("# test_my_model.py")]
    assert len(found) == 1, "the README's testing section lost its example test"
    return found[0]


def test_readme_example_test_runs_as_written(tmp_path):
    (tmp_path / "test_my_model.py").write_text(_readme_example())
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_model.py"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout + r.stderr


@pytest.mark.dataplane  # the example starts the C dataplane and the duck emulator
def test_api_mds_killing_one_duck_example_runs_as_written(tmp_path):
    cluster_class_or_skip()
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs/api.md").read_text(), re.S)
    found = [b for b in blocks if b.startswith("# test_a_dead_duck.py")]
    assert len(found) == 1, "api.md's plugin section lost its example of killing one duck"
    (tmp_path / "test_a_dead_duck.py").write_text(found[0])
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_a_dead_duck.py"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
