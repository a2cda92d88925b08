"""The one byte formatter: sizes as the Hugging Face Hub shows them (decimal units, 3 digits)."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

from dflash_chat.models.sizes import rate_text, size_text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (1_580, "1.58 kB"),
        (503_700_000, "504 MB"),
        (999_700_000, "1 GB"),  # rounds up into the next unit, never "1000 MB"
        (1_030_000_000, "1.03 GB"),
        (3_460_000_000, "3.46 GB"),
        (16_500_000_000, "16.5 GB"),  # the 27B Q4_K_M file as its Hub page shows it, not 15.4 GB
        (28_600_000_000, "28.6 GB"),
        (29_000_000_000, "29 GB"),
        (25_769_803_776, "25.8 GB"),  # a "24 GB" card's bytes, in the same units as the files
        (-2_000_000, "-2 MB"),
    ],
)
def test_sizes_read_as_on_the_hub(n, text):
    assert size_text(n) == text


def test_rates():
    assert rate_text(45_200_000) == "45.2 MB/s"


def test_every_byte_figure_goes_through_the_one_formatter():
    """No module prints a size by dividing by a byte unit itself (2**20, a GIB constant, or 10**9
    before "GB"): models/sizes.py is the one place that turns bytes into text."""
    root = pathlib.Path(__file__).resolve().parents[1] / "dflash_chat"
    offenders = []
    for path in sorted(root.rglob("*.py")):
        if path.name != "models/sizes.py":
            offenders += [f"{path.relative_to(root)}:{line}" for line in byte_divisions(path.read_text())]
    assert offenders == []


def test_the_check_finds_a_formatter_of_its_own():
    code = (
        "GIB = 2**30\n"
        "a = f'{n / GIB:.1f} GB'\n"
        "b = f'{n / 2**20:.1f}'\n"
        "c = f'{n / 1e9:.1f} GB'\n"
        "d = f'{params / 1e6:.2f}M parameters'\n"  # not bytes
    )
    assert byte_divisions(code) == [2, 3, 4]


BINARY = {2**10, 2**20, 2**30, 2**40}
DECIMAL = {10**3, 10**6, 10**9, 10**12}
BYTE_UNIT = re.compile(r"^\s*[kKMGT]i?B\b")


def byte_divisions(source: str) -> list[int]:
    """Lines of f-strings that divide by a byte unit: a binary one anywhere, a decimal one before a byte unit."""
    tree = ast.parse(source)
    names = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if (value := _number(node.value, names)) is not None:
                names[node.targets[0].id] = value
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.JoinedStr):
            continue
        for i, part in enumerate(node.values):
            if not isinstance(part, ast.FormattedValue):
                continue
            after = node.values[i + 1] if i + 1 < len(node.values) else None
            unit_follows = isinstance(after, ast.Constant) and BYTE_UNIT.match(str(after.value))
            for div in ast.walk(part.value):
                if isinstance(div, ast.BinOp) and isinstance(div.op, ast.Div):
                    value = _number(div.right, names)
                    if value in BINARY or (value in DECIMAL and unit_follows):
                        lines.append(node.lineno)
    return sorted(set(lines))


def _number(node, names):
    """The value of a constant arithmetic expression (2**30, 1 << 20, 1e9, a NAME bound to one), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Pow, ast.Mult, ast.LShift)):
        left, right = _number(node.left, names), _number(node.right, names)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Pow):
            return left**right
        return left * right if isinstance(node.op, ast.Mult) else int(left) << int(right)
    return None
