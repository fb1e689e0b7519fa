"""The README's AOTInductor and onboarding examples run as written (each section in a fresh process)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
_HEADING = re.compile(r"^(#+)\s+(.*?)\s*$")
_FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def section_code(title: str, text: str) -> str:
    """The python code blocks under the heading `title`, up to the next heading of the same or higher level."""
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
            blocks = _FENCE.findall("".join(lines[i + 1 : end]))
            assert blocks, f"no python example under '{title}'"
            return "\n".join(blocks)
    raise AssertionError(f"README has no heading '{title}'")


def test_section_code_stops_at_the_next_heading():
    text = "## A\n```python\na = 1\n```\n### A.1\n```python\nb = 2\n```\n## B\n```python\nc = 3\n```\n"
    assert section_code("A", text) == "a = 1\n\nb = 2\n"
    assert section_code("A.1", text) == "b = 2\n"


@pytest.mark.parametrize("title", ["Export with AOTInductor", "Onboarding a new backend"])
def test_readme_example_runs(title, tmp_path):
    code = section_code(title, README.read_text())
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{title}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
