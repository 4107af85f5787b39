"""Parsers for the numbers users write: parameter counts, Kubernetes quantities, bandwidths, money.

Each parser raises ``ValueError`` with a message meant for a pod event, so callers can surface it
verbatim instead of inventing their own wording.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from app.base.reasons import shown

# One number grammar for every annotation (docs/annotations.md, "Numbers"): an optional sign, ASCII
# digits, then where the value means it a decimal part and an exponent, then where the value has
# units a suffix (one space allowed before it). [0-9], never \d or float() alone: both take
# full-width and other Unicode digits (U+FF17 U+FF10 read as 70), and float() takes "1_000".
_NUMBER = re.compile(
    r"(?P<sign>[+-]?)(?P<whole>[0-9]+)(?P<frac>\.[0-9]+)?(?P<exp>[eE][+-]?[0-9]+)?"
    r"(?: ?(?P<unit>[A-Za-z/]+))?")
_PARAM_SCALE = {k: v for s, v in (("k", 1e3), ("m", 1e6), ("b", 1e9), ("t", 1e12)) for k in (s, s.upper())}
_BW_SCALE = {"": 1.0, **{u: f for us, f in (("TB/s", 1.0), ("TBps", 1.0), ("T", 1.0), ("GB/s", 1e-3),
                                         ("GBps", 1e-3), ("G", 1e-3)) for u in (us, us.lower(), us.upper())}}

_QTY = re.compile(r"^\s*([+]?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$", re.ASCII)
_QTY_SCALE = {
    "": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
}

# Upper bounds on what a pod or node may declare (docs/annotations.md, "Invalid values"). The API
# server stores quantities such as "1e400" verbatim; as floats they are infinite, and one infinite or
# absurd figure must be rejected here rather than overflow an int() or round() deep in placement.
MAX_QUANTITY = 2.0**63  # Kubernetes' own int64 ceiling for a quantity's value
MAX_PARAMS = 1e16  # 10,000T parameters
MAX_NUMBER = 1e12  # any plain annotation number (GB, ms, dollars)
MAX_INT = 2**31 - 1
MAX_BANDWIDTH_TBS = 1e6
# The fastest GPU today has a few thousand dense BF16 TFLOPS; an operator's figure past this is a typo.
MAX_GPU_TFLOPS = 100_000.0
_TFLOPS_SCALE = {"": 1.0, "TFLOPS": 1.0, "tflops": 1.0, "TFLOP/s": 1.0}
MAX_TEXT = 64  # characters of a bad value quoted back in a message


def quote(text: object) -> str:
    """A value quoted back to the user, cut short (a 250 KB value must not become a 250 KB event) and
    escaped (a newline or NUL in an annotation must not become a second line of the event)."""
    return shown(text, MAX_TEXT)


def parse_number(
    key: str, text: object, *, what: str = "a number like 50 or 2.5", whole: bool = False,
    units: Mapping[str, float] | None = None, allow_zero: bool = False, maximum: float = MAX_NUMBER,
) -> float:
    """The one parser behind every numeric annotation: ``text`` read by the grammar above.

    ``whole``: digits only; ``units``: the suffixes allowed and their scale ("" present: the suffix
    may be left out). An exponent is meaningful only for a plain decimal (``1.5e3`` ms), never for a
    whole count or beside a unit (``1e3B``). Raises ValueError naming ``key`` and quoting the value,
    worded for a pod event.
    """
    raw = text.strip() if isinstance(text, str) else str(text) \
        if isinstance(text, int | float) and not isinstance(text, bool) else ""
    m = _NUMBER.fullmatch(raw)  # linear in the length; the API server bounds annotations anyway
    unit = (m.group("unit") or "") if m else ""
    if (m is None or (whole and (m.group("frac") or m.group("exp")))
            or (m.group("exp") and units is not None)
            or (unit not in units if units is not None else unit != "")):
        raise ValueError(f'{key} "{quote(text)}" is not {what}')
    number = m.group("sign") + m.group("whole") + (m.group("frac") or "") + (m.group("exp") or "")
    value = float(number) * (units[unit] if units is not None else 1.0)  # 400 digits: inf, not slow
    if value < 0 or (value == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "greater than zero"
        raise ValueError(f'{key} "{quote(text)}" must be {bound}')
    if not value <= maximum:
        limit = f"{maximum:.0f}" if maximum == int(maximum) and maximum < 1e10 else f"{maximum:g}"
        raise ValueError(f'{key} "{quote(text)}" is larger than {limit}')
    return abs(value)  # "-0" is 0


def parse_param_count(text: str, key: str = "model-params") -> float:
    """``"7B"`` -> 7e9. Accepts K, M, B and T suffixes (any case), decimals such as ``1.8T``."""
    return parse_number(key, text, what="a parameter count like 7B or 1.5T",
                        units=_PARAM_SCALE, maximum=MAX_PARAMS)


def parse_quantity(text: str | int | float) -> float:
    """A Kubernetes resource quantity (``"500m"``, ``"64Gi"``, ``8``) as a float in base units."""
    if isinstance(text, bool):
        raise ValueError(f"quantity {text!r} is not a number")
    if isinstance(text, int | float):
        value = float(text) if not isinstance(text, int) or abs(text) <= MAX_QUANTITY else math.inf
        if not math.isfinite(value) or value < 0 or value > MAX_QUANTITY:
            raise ValueError(f"quantity {quote(text)} must be a finite non-negative number below 2^63")
        return value
    m = _QTY.match(text) if isinstance(text, str) else None
    if not m or m.group(2) not in _QTY_SCALE:
        raise ValueError(f'quantity "{quote(text)}" is not a Kubernetes quantity like 500m, 8 or 64Gi')
    value = float(m.group(1)) * _QTY_SCALE[m.group(2)]
    if not value <= MAX_QUANTITY:  # also catches inf ("1e400") and nan
        raise ValueError(f'quantity "{quote(text)}" is larger than 2^63 (not a real amount)')
    return value


def parse_positive_number(key: str, text: str, *, allow_zero: bool = False) -> float:
    """A plain number from an annotation, finite and > 0 (or >= 0 with ``allow_zero``)."""
    return parse_number(key, text, allow_zero=allow_zero)


def parse_positive_int(key: str, text: str) -> int:
    """A whole number > 0 from an annotation."""
    return int(parse_number(key, text, what="a whole number", whole=True, maximum=MAX_INT))


def parse_bandwidth_tbs(text: str) -> float:
    """``"4.1TB/s"`` or ``"900GB/s"`` -> TB/s. A bare number is read as TB/s."""
    return parse_number("bandwidth", text, what="like 3.35TB/s or 900GB/s", units=_BW_SCALE,
                        maximum=MAX_BANDWIDTH_TBS)


def parse_tflops(text: str) -> float:
    """``"1500"`` or ``"1500 TFLOPS"`` -> 1500.0 (dense BF16 TFLOPS per GPU)."""
    return parse_number("gpu-bf16-tflops", text, what="dense BF16 TFLOPS like 989 or 989 TFLOPS",
                        units=_TFLOPS_SCALE, maximum=MAX_GPU_TFLOPS)


def parse_money(text: str) -> float:
    """``"$2.50"``, ``"2.5"`` or ``"2.5/h"`` -> 2.5 (dollars per hour)."""
    if not isinstance(text, str):
        raise ValueError(f'hourly-cost "{quote(text)}" is not a number')
    cleaned = text.strip().lstrip("$").removesuffix("/h").removesuffix("/hr").strip()
    return parse_positive_number("hourly-cost", cleaned, allow_zero=True)
