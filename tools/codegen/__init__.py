"""The build's code generators: every generated file rendered from duckpipe/schema/.

render.py renders the C ABI headers, schemas/*.json and docs/protocols.md (docgen.py);
ctlgen.py the control codec and the config reader in C. Build tools, not the package:
duckpipe never imports them (tests/tools/test_python_seams.py holds it to that), and a
wheel does not carry them. tools/gen_abi.py writes what they render; the tests import
them with tools/ on sys.path (pyproject.toml's pytest ``pythonpath``).
"""

from .render import ROOT, render_all

__all__ = ["ROOT", "render_all"]
