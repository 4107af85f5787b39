"""Parsers for the numbers users write: parameter counts, Kubernetes quantities, bandwidths, money.

Each parser raises ``ValueError`` with a message meant for a pod event, so callers can surface it
verbatim instead of inventing their own wording.
"""

from __future__ import annotations

import math
import re

from app.core.reasons import shown

_PARAMS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMbBtT])\s*$")
_PARAM_SCALE = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}

_QTY = re.compile(r"^\s*([+]?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*([a-zA-Z]*)\s*$")
_QTY_SCALE = {
    "": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
}

_BW = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(TB/s|GB/s|TBps|GBps|T|G)?\s*$", re.IGNORECASE)

# Upper bounds on what a pod or node may declare (docs/annotations.md, "Invalid values"). The API
# server stores quantities such as "1e400" verbatim; as floats they are infinite, and one infinite or
# absurd figure must be rejected here rather than overflow an int() or round() deep in placement.
MAX_QUANTITY = 2.0**63  # Kubernetes' own int64 ceiling for a quantity's value
MAX_PARAMS = 1e16  # 10,000T parameters
MAX_NUMBER = 1e12  # any plain annotation number (GB, ms, dollars)
MAX_INT = 2**31 - 1
MAX_BANDWIDTH_TBS = 1e6
MAX_TEXT = 64  # characters of a bad value quoted back in a message


def quote(text: object) -> str:
    """A value quoted back to the user, cut short (a 250 KB value must not become a 250 KB event) and
    escaped (a newline or NUL in an annotation must not become a second line of the event)."""
    return shown(text, MAX_TEXT)


def parse_param_count(text: str) -> float:
    """``"7B"`` -> 7e9. Accepts K, M, B and T suffixes (any case), decimals such as ``1.8T``."""
    m = _PARAMS.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f'model-params "{quote(text)}" is not a parameter count like 7B or 1.5T')
    value = float(m.group(1)) * _PARAM_SCALE[m.group(2).lower()]
    if value <= 0:
        raise ValueError(f'model-params "{quote(text)}" must be positive')
    if not value <= MAX_PARAMS:
        raise ValueError(f'model-params "{quote(text)}" is larger than {MAX_PARAMS:g} parameters')
    return value


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
    try:
        value = float(text) if isinstance(text, str | int | float) else math.nan
    except (TypeError, ValueError, OverflowError):
        value = math.nan
    if not math.isfinite(value):  # not a number, "inf", "nan", or 400 digits
        raise ValueError(f'{key} "{quote(text)}" is not a finite number')
    if value < 0 or (value == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "greater than zero"
        raise ValueError(f'{key} "{quote(text)}" must be {bound}')
    if value > MAX_NUMBER:
        raise ValueError(f'{key} "{quote(text)}" is larger than {MAX_NUMBER:g}')
    return value


def parse_positive_int(key: str, text: str) -> int:
    """A whole number > 0 from an annotation."""
    raw = str(text).strip() if isinstance(text, str | int) and not isinstance(text, bool) else ""
    # Digits only (int() would also take "1_000" and 5,000-digit strings cost quadratic time).
    if not raw.lstrip("+-").isdigit() or not raw.isascii() or len(raw) > 12:
        if raw.lstrip("+-").isdigit() and raw.isascii():
            raise ValueError(f'{key} "{quote(text)}" is larger than {MAX_INT}')
        raise ValueError(f'{key} "{quote(text)}" is not a whole number')
    value = int(raw)
    if value <= 0:
        raise ValueError(f'{key} "{quote(text)}" must be greater than zero')
    if value > MAX_INT:
        raise ValueError(f'{key} "{quote(text)}" is larger than {MAX_INT}')
    return value


def parse_bandwidth_tbs(text: str) -> float:
    """``"4.1TB/s"`` or ``"900GB/s"`` -> TB/s. A bare number is read as TB/s."""
    m = _BW.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f'bandwidth "{quote(text)}" is not like 3.35TB/s or 900GB/s')
    value = float(m.group(1))
    unit = (m.group(2) or "TB/s").upper()
    if unit.startswith("G"):
        value /= 1000.0
    if value <= 0:
        raise ValueError(f'bandwidth "{quote(text)}" must be positive')
    if not value <= MAX_BANDWIDTH_TBS:
        raise ValueError(f'bandwidth "{quote(text)}" is larger than {MAX_BANDWIDTH_TBS:g} TB/s')
    return value


def parse_money(text: str) -> float:
    """``"$2.50"``, ``"2.5"`` or ``"2.5/h"`` -> 2.5 (dollars per hour)."""
    if not isinstance(text, str):
        raise ValueError(f'hourly-cost "{quote(text)}" is not a number')
    cleaned = text.strip().lstrip("$").removesuffix("/h").removesuffix("/hr").strip()
    return parse_positive_number("hourly-cost", cleaned, allow_zero=True)
