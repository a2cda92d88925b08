"""The one byte formatter: sizes the way the Hugging Face Hub shows them.

Decimal units (1 GB = 10^9 bytes) and three significant digits, trailing zeros dropped, so the
figure a user reads here is the one on the model's Hub page: a 16,500,000,000-byte file is
"16.5 GB" (never "15.4 GB"), a 3,460,000,000-byte drafter "3.46 GB", 1,580 bytes "1.58 kB".
Memory (VRAM, RAM) is shown in the same units, so "needs X, Y free" compares like with like.
"""

from __future__ import annotations

GB = 10**9
_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def size_text(n: int | float) -> str:
    """Bytes for people: '512 B', '1.58 kB', '504 MB', '16.5 GB', '28 GB'."""
    sign = "-" if n < 0 else ""
    value = abs(float(n))
    unit = 0
    while value >= 1000 and unit < len(_UNITS) - 1:
        value /= 1000
        unit += 1
    if unit == 0:
        return f"{sign}{int(round(value))} B"
    text = _three_digits(value)
    if text == "1000" and unit < len(_UNITS) - 1:  # 999.7 MB rounds up to the next unit
        text, unit = "1", unit + 1
    return f"{sign}{text} {_UNITS[unit]}"


def rate_text(bytes_per_second: float) -> str:
    """A transfer speed: '45.2 MB/s'."""
    return f"{size_text(bytes_per_second)}/s"


def _three_digits(value: float) -> str:
    decimals = 0 if value >= 100 else 1 if value >= 10 else 2
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
