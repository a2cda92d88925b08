"""Rules of the code itself (the project's standards) that a test can hold."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dflash_chat"
WHY = "One file past 500 lines: "  # the line right under a long module's first line says why it is one


def test_a_module_over_500_lines_says_at_its_top_why_it_is_one_file():
    unsaid = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        text = path.read_text()
        if text.count("\n") <= 500:
            continue
        doc = ast.get_docstring(ast.parse(text), clean=False) or ""
        lines = doc.splitlines()
        if len(lines) < 2 or not lines[1].startswith(WHY) or len(lines[1]) <= len(WHY) + 20:
            unsaid.append(name)
    assert not unsaid, f"split these, or say why each is one file under its docstring's first line: {unsaid}"
