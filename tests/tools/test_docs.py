"""The README and docs/ stay true: links resolve, every shell block is run by a test or
marked illustrative, topologies decode, and the reference tables name every counter,
topology key and command option there is."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from duckpipe.launch.topology import Duck, Nic, Topology, load

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
SHELLS = {"sh", "bash", "shell", "console", "zsh"}
MARK = re.compile(r"^\s*<!--\s*(runs-in|illustrative):\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")


@dataclass
class Block:
    page: Path
    line: int  # 1-based, the opening fence
    lang: str
    body: list[str]
    mark: str  # "runs-in", "illustrative" or ""
    mark_arg: str
    heading: str  # the nearest heading above, without its '#'s

    def where(self) -> str:
        return f"{_name(self.page)}:{self.line}"


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


def _blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    out: list[Block] = []
    heading = ""
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            if lines[i].startswith("#"):
                heading = lines[i].lstrip("#").strip()
            i += 1
            continue
        indent, fence, lang = m.groups()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        mm = MARK.match(prev)
        out.append(
            Block(
                page,
                start + 1,
                lang.lower(),
                body,
                mm.group(1) if mm else "",
                mm.group(2) if mm else "",
                heading,
            )
        )
        i += 1
    return out


def _commands(body: list[str]) -> list[str]:
    """A shell block's commands: comments dropped, backslash continuations joined."""
    out: list[str] = []
    pending = ""
    for raw in body:
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip() and not pending:
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        out.append((pending + line.strip()).strip())
        pending = ""
    if pending:
        out.append(pending.strip())
    return [c for c in out if c]


def _resolve(name: str) -> Path | None:
    """A runs-in file: a path from the top of the tree, or a file name under tests/,
    tools/ or .ci/ (tests move between areas; their names stay)."""
    path = ROOT / name
    if path.is_file():
        return path
    found = [p for d in ("tests", "tools", ".ci") for p in (ROOT / d).rglob(Path(name).name)]
    return found[0] if len(found) == 1 else None


def _github_slugs(page: Path) -> set[str]:
    """Anchors GitHub makes for a page's headings (outside code blocks)."""
    slugs: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        if in_code or not re.match(r"#{1,6} ", line):
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line.lstrip("#").strip())
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        slugs.add(slug if n == 0 else f"{slug}-{n}")
    return slugs


def _prose(page: Path) -> str:
    """The page without its code blocks and inline code (links there are not links)."""
    text = re.sub(r"^([ \t]*)(```+|~~~+).*?^\1\2[ \t]*$", "", page.read_text(), flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


# --- the README ------------------------------------------------------------------------


def test_the_readme_fits_about_a_screen_and_links_every_doc_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 200, len(text.splitlines())
    for page in DOCS:
        assert f"](docs/{page.name})" in text, f"the README does not link {page.name}"


# --- links -------------------------------------------------------------------------------


def _broken_links(page: Path) -> list[str]:
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path_s, _, anchor = target.partition("#")
        path = (page.parent / path_s).resolve() if path_s else page
        if not path.exists():
            bad.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _github_slugs(path):
            bad.append(f"{target}: no heading makes #{anchor} in {path.name}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_relative_link_resolves_to_a_file_and_anchor(page):
    bad = _broken_links(page)
    assert not bad, f"{_name(page)}: " + "; ".join(bad)


def test_the_link_check_sees_a_broken_link_and_a_broken_anchor(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "# Top\n\n## A b's c\n\n[ok](#a-bs-c) [bad](#nope) [gone](missing.md) `[no](x.md)`\n"
        "\n```sh\n[not a link](nowhere.md)\n```\n"
    )
    assert _github_slugs(page) == {"top", "a-bs-c"}
    assert _broken_links(page) == [
        "#nope: no heading makes #nope in p.md",
        "missing.md: no such file",
    ]


# --- shell blocks: run by a test, or marked illustrative ---------------------------------


def _shell_blocks() -> list[Block]:
    return [b for page in PAGES for b in _blocks(page) if b.lang in SHELLS]


def test_every_shell_block_is_run_by_a_test_or_marked_illustrative():
    unmarked = [b.where() for b in _shell_blocks() if not b.mark]
    assert not unmarked, (
        "shell blocks with neither <!-- runs-in: FILE --> nor <!-- illustrative: why --> "
        f"on the line before: {unmarked}"
    )
    vague = [b.where() for b in _shell_blocks() if not b.mark_arg.strip()]
    assert not vague, f"a mark must name its files or say why: {vague}"


def test_every_mark_stands_before_a_shell_block():
    for page in PAGES:
        lines = page.read_text().splitlines()
        shell_lines = {b.line for b in _blocks(page) if b.lang in SHELLS}
        for n, line in enumerate(lines, 1):
            if MARK.match(line):
                nxt = next(k for k in range(n + 1, len(lines) + 1) if lines[k - 1].strip())
                assert nxt in shell_lines, f"{_name(page)}:{n}: a mark with no block"


@pytest.mark.parametrize(
    "block", [b for b in _shell_blocks() if b.mark == "runs-in"], ids=Block.where
)
def test_a_runs_in_block_is_run_by_the_files_it_names(block):
    """Each named file exists, and either holds each command of the block or reads the
    block from its page: it names the page and the heading the block sits under."""
    files = [n for n in re.split(r"[\s,]+", block.mark_arg) if n]
    paths = [_resolve(n) for n in files]
    lost = [n for n, p in zip(files, paths, strict=True) if p is None]
    assert not lost, f"{block.where()}: cannot find {lost}"
    texts = [p.read_text() for p in paths if p]
    page_name = block.page.name
    reads_it = any(page_name in t and block.heading in t for t in texts)
    missing = [c for c in _commands(block.body) if not any(c in t for t in texts)]
    assert reads_it or not missing, (
        f"{block.where()}: {files} neither run {missing} nor read the block "
        f"({page_name}, under '{block.heading}')"
    )


def test_the_runs_in_check_refuses_a_file_that_runs_something_else(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("## Run\n\n<!-- runs-in: .ci/run -->\n```sh\nmake everything\n```\n")
    (block,) = _blocks(page)
    assert (block.mark, block.mark_arg, block.heading) == ("runs-in", ".ci/run", "Run")
    with pytest.raises(AssertionError, match="make everything"):
        test_a_runs_in_block_is_run_by_the_files_it_names(block)


def test_commands_are_read_without_comments_and_with_continuations_joined():
    body = ["# setup", "ip link add a \\", "    type veth   # a pair", "", "duckpipe ducks &"]
    assert _commands(body) == ["ip link add a type veth", "duckpipe ducks &"]


# --- reference tables against the code ---------------------------------------------------


def _section(page: Path, heading: str) -> str:
    text = page.read_text()
    start = text.index(heading)
    level = heading.split(" ", 1)[0]
    end = text.find(f"\n{level} ", start + len(heading))
    return text[start : end if end > 0 else len(text)]


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_topology_in_the_docs_decodes(page, tmp_path):
    blocks = [b for b in _blocks(page) if b.lang == "toml"]
    for b in blocks:
        f = tmp_path / "topology.toml"
        f.write_text("\n".join(b.body) + "\n")
        topo = load(f)  # raises BadInput naming the key
        assert topo.nics and all(n.ducks for n in topo.nics), b.where()


def test_the_topology_table_names_every_key_and_no_other():
    section = _section(ROOT / "docs" / "walkthrough.md", "## Topology files")
    rows = [r for r in section.splitlines() if r.startswith("| `") or r.startswith("| `[[")]
    documented = set()
    for row in rows:
        documented |= set(re.findall(r"`(\w+)`", row.split("|")[1]))
    keys = {f.name for cls in (Topology, Nic, Duck) for f in msgspec.structs.fields(cls)}
    keys -= {"nics", "ducks"}  # the tables themselves: [[nics]], [[nics.ducks]]
    assert keys - documented == set(), "topology keys the walkthrough does not list"
    assert documented - keys - {"nics"} == set(), "keys the walkthrough lists that do not exist"


def test_the_counters_table_names_every_counter():
    from duckpipe.schema.stats import COUNTER_NAMES  # the one list (C's is generated from it)

    counters = set(COUNTER_NAMES)
    assert len(counters) > 40, counters
    section = _section(ROOT / "docs" / "walkthrough.md", "### Counters")
    listed = {n for row in section.splitlines() if row.startswith("| `")
              for n in re.findall(r"`(\w+)`", row.split("|")[1])}  # fmt: skip
    assert counters - listed == set(), "counters the walkthrough's table does not list"
    assert listed - counters == set(), "counters the walkthrough lists that do not exist"


def _help(argv: list[str]) -> str:
    r = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_every_option_in_the_commands_table_exists():
    venv_bin = Path(sys.executable).parent
    section = _section(ROOT / "docs" / "walkthrough.md", "## Commands")
    checked = 0
    for row in section.splitlines():
        if not row.startswith("| `duckpipe"):
            continue
        usage = re.split(r"(?<!\\)\|", row)[1].replace("\\|", "|")
        for part in usage.split(" / "):  # `duckpipe shm ls ...` / `duckpipe shm clean ...`
            words = re.findall(r"[\w-]+", part.strip(" `"))
            if words[0] == "duckpipe-top":
                argv = [str(venv_bin / "duckpipe-top")]
            else:
                sub = [w for w in words[1:3] if not w.startswith("-") and w.islower()]
                sub = sub[:2] if sub[:1] == ["shm"] else sub[:1]
                argv = [str(venv_bin / "duckpipe"), *sub]
            text = _help(argv)
            for opt in re.findall(r"(?<![\w-])(--[a-z][\w-]*|-[a-z])\b", part):
                assert re.search(rf"(?<![\w-]){re.escape(opt)}\b", text), (
                    f"{' '.join(argv[1:]) or 'duckpipe-top'}: no option {opt}"
                )
                checked += 1
    assert checked > 50, checked


def test_the_whole_jobs_time_is_one_sourced_figure_everywhere():
    # it was three (18 min 7 s, 17 min 10 s, 18 min 4 s and more), from different runs
    pages = [*PAGES, ROOT / "tests/README.md"]
    figures = {
        (m.group(0), _name(p))
        for p in pages
        for m in re.finditer(r"\b\d+ min \d+ s\b", p.read_text())
    }
    assert len({f for f, _ in figures}) == 1, sorted(figures)
    (figure,) = {f for f, _ in figures}
    text = (ROOT / "tests/README.md").read_text()
    ci = text[text.index("## CI: `tools/setup test`") :]
    run = re.search(r"The last CI run, at ([0-9a-f]{7,})", ci).group(1)
    for _, page in figures:  # each says which run it was
        assert run in (ROOT / page).read_text(), page
    # and the passes of tests/README.md's table add up to it
    passes = sum(int(n) for n in re.findall(r"\| (\d+) s \|$", ci, re.M))
    rest = int(re.search(r"the other (\d+) s\.", ci).group(1))
    minutes, seconds = map(int, re.findall(r"\d+", figure))
    assert passes + rest == minutes * 60 + seconds, (passes, rest, figure)


def test_the_quick_test_loop_is_given_with_its_measured_time():
    loop = '-m "not slow" tests/client'
    assert loop in README.read_text()
    text = (ROOT / "docs/contributing.md").read_text()
    line = next(ln for ln in text.splitlines() if loop in ln and ln.startswith(".venv"))
    assert re.search(r"# \d+ tests, \d+ s$", line), line
    assert "shared" in text[text.index(line) :][:1200]  # says the machine was shared
