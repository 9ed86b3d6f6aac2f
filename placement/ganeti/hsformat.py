"""Formatting the way htools' Haskell code prints, so outputs compare byte for byte.

Contract: `show_double` is Haskell's ``show :: Double -> String`` (shortest round-trip
digits, ``0.1 <= |x| < 10^7`` in positional notation with at least one decimal, otherwise
``d.ddde<exp>``); `ensure_quoted` and `hts_lines` reproduce ``printKeys`` for hspace's
``--machine-readable`` output.
"""

from __future__ import annotations

import math


def show_double(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    sign = "-" if x < 0 else ""
    digits, exponent = _shortest_digits(abs(x))
    # value = 0.d1d2d3... × 10^exponent (Haskell's floatToDigits convention)
    if 0.1 <= abs(x) < 10**7:
        if exponent <= 0:
            return f"{sign}0.{'0' * -exponent}{digits}"
        whole = digits[:exponent].ljust(exponent, "0")
        frac = digits[exponent:] or "0"
        return f"{sign}{whole}.{frac}"
    frac = digits[1:] or "0"
    return f"{sign}{digits[0]}.{frac}e{exponent - 1}"


def _shortest_digits(x: float) -> tuple[str, int]:
    """Digits and exponent with x = 0.DIGITS × 10^exponent, shortest that round-trips."""
    text = repr(x)
    if "e" not in text:
        int_part, _, frac_part = text.partition(".")
        if int_part != "0":
            digits = (int_part + frac_part).rstrip("0")
            exponent = len(int_part)
        else:
            stripped = frac_part.lstrip("0")
            exponent = -(len(frac_part) - len(stripped))
            digits = stripped.rstrip("0")
        return digits or "0", exponent
    mantissa, _, exp_text = text.partition("e")
    exp = int(exp_text)
    int_part, _, frac_part = mantissa.partition(".")
    digits = (int_part + frac_part).rstrip("0")
    return digits or "0", exp + 1


def ensure_quoted(value: str) -> str:
    if not all(c.isalnum() or c == "." for c in value):
        return f"'{value}'"
    return value


def hts_lines(pairs, prefix: str = "HTS") -> list[str]:
    return [f"{prefix}_{key.upper()}={ensure_quoted(value)}" for key, value in pairs]
