"""The README's use example and the docs' AOTInductor and onboarding examples run as written: each section's
Python code in a fresh process, then its shell blocks in the same folder (the serving recipe loads the package
the Python exported). Every relative link in README.md, BENCHMARKS.md and docs/*.md points to a file that exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, SUBPROCESS_TIMEOUT_S

DOCS = ROOT / "docs"
EXAMPLES = {
    "Use": ROOT / "README.md",
    "Export with AOTInductor": DOCS / "aoti.md",
    "Onboarding a new backend": DOCS / "backends.md",
}
_HEADING = re.compile(r"^(#+)\s+(.*?)\s*$")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE = re.compile(r"^```.*?^```|`[^`\n]*`", re.S | re.M)


def _fence(lang: str) -> re.Pattern[str]:
    return re.compile(rf"^```{lang}\n(.*?)^```", re.S | re.M)


def section_code(title: str, text: str, lang: str = "python") -> str:
    """The `lang` code blocks under the heading `title`, up to the next heading of the same or higher level."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        m = _HEADING.match(line)
        if m and m.group(2) == title:
            level = len(m.group(1))
            end = next(
                (
                    j
                    for j in range(i + 1, len(lines))
                    if (h := _HEADING.match(lines[j])) and len(h.group(1)) <= level
                ),
                len(lines),
            )
            blocks = _fence(lang).findall("".join(lines[i + 1 : end]))
            if lang != "python":
                return "\n".join(blocks)
            assert blocks, f"no python example under '{title}'"
            return "\n".join(blocks)
    raise AssertionError(f"no heading '{title}'")


def test_section_code_stops_at_the_next_heading():
    text = "## A\n```python\na = 1\n```\n### A.1\n```python\nb = 2\n```\n## B\n```python\nc = 3\n```\n"
    assert section_code("A", text) == "a = 1\n\nb = 2\n"
    assert section_code("A.1", text) == "b = 2\n"
    assert section_code("A", text + "```bash\necho c\n```\n", "bash") == ""  # that block is under B
    assert section_code("B", text + "```bash\necho c\n```\n", "bash") == "echo c\n"


def relative_links(text: str) -> list[str]:
    """The targets of markdown links in `text` that are paths (no URL, no in-page anchor), outside code."""
    targets = (m.group(1) for m in _LINK.finditer(_CODE.sub("", text)))
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]


def test_relative_links_finds_paths_only():
    text = (
        "[a](docs/a.md) [b](https://x.org/b.md) [c](#top) [d](../e.md#sec) `[f](g.md)`\n```\n[h](i.md)\n```\n"
    )
    assert relative_links(text) == ["docs/a.md", "../e.md"]


@pytest.mark.parametrize(
    "page", ["README.md", "BENCHMARKS.md", *sorted(f"docs/{p.name}" for p in DOCS.glob("*.md"))]
)
def test_relative_links_point_to_files(page):
    path = ROOT / page
    missing = [t for t in relative_links(path.read_text()) if not (path.parent / t).exists()]
    assert not missing, f"{page} links to missing files: {missing}"


@pytest.mark.parametrize(
    "page", ["README.md", "BENCHMARKS.md", *sorted(f"docs/{p.name}" for p in DOCS.glob("*.md"))]
)
def test_page_tells_no_session_history(page):
    """Pages state facts and where their evidence lives, not which work session produced them."""
    hits = re.findall(r".{0,40}\bsessions? \d.{0,40}", (ROOT / page).read_text(), re.I)
    assert not hits, f"{page}: {hits}"


@pytest.mark.parametrize("title", sorted(EXAMPLES))
def test_doc_example_runs(title, tmp_path):
    text = EXAMPLES[title].read_text()
    proc = subprocess.run(
        [sys.executable, "-c", section_code(title, text)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, f"{title}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    shell = section_code(title, text, "bash")
    if shell:  # `python` in the docs is this interpreter
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", shell],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT_S,
        )
        assert proc.returncode == 0, f"{title} (shell):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"


def test_export_section_serves_without_qlower():
    """The serving recipe runs the package in a process that never imports qlower."""
    shell = section_code("Export with AOTInductor", EXAMPLES["Export with AOTInductor"].read_text(), "bash")
    serve = shell[shell.index('python -c "') :]
    assert "import qlower" not in serve and "load_library('./libqlower_ops.so')" in serve
    assert serve.index("load_library") < serve.index("aoti_load_package")
