"""Numbers as people read them: significant digits, SI prefixes, and the mark of a number that is unknown.

At the bottom, so that every layer writes a number the same way: the diagnosis ("640 GFLOP/s"), the batch-size
search's summary, the tables and the figures.
"""

from __future__ import annotations

import math

MISSING = "–"


def number(value: float | None, spec: str, suffix: str = "") -> str:
    """``value`` in the format ``spec``; the missing mark where it is unknown."""
    return MISSING if value is None else f"{value:{spec}}{suffix}"


def decimals(value: float, digits: int = 3) -> int:
    """Decimals that show ``value`` with ``digits`` significant digits (none dropped before the point)."""
    if value == 0 or not math.isfinite(value):
        return digits - 1
    return max(0, digits - 1 - math.floor(math.log10(abs(value))))


def significant(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, thousands separated: 640, 64.0, 0.640, 12,345."""
    return f"{value:,.{decimals(value, digits)}f}"


def bytes_text(value: int) -> str:
    """A memory size as people read one: GiB from 1 GiB up ("1.50 GiB"), MiB below it ("812 MiB")."""
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:,.0f} MiB"


_SI_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(value: float, unit: str) -> str:
    """``value`` with the SI prefix that leaves 1 to 999 before the point: 640 GFLOP/s, 156 TFLOP/s."""
    rounded = float(f"{value:.3g}")  # 999.7e9 is 1.00 T, not 1,000 G
    for scale, prefix in _SI_PREFIXES:
        if abs(rounded) >= scale:
            return f"{significant(rounded / scale)} {prefix}{unit}"
    return f"{significant(rounded)} {unit}"
