"""Parsers for the numbers users write: parameter counts, Kubernetes quantities, bandwidths, money.

Each parser raises ``ValueError`` with a message meant for a pod event, so callers can surface it
verbatim instead of inventing their own wording.
"""

from __future__ import annotations

import math
import re

_PARAMS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMbBtT])\s*$")
_PARAM_SCALE = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}

_QTY = re.compile(r"^\s*([+]?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*([a-zA-Z]*)\s*$")
_QTY_SCALE = {
    "": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
}

_BW = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(TB/s|GB/s|TBps|GBps|T|G)?\s*$", re.IGNORECASE)


def parse_param_count(text: str) -> float:
    """``"7B"`` -> 7e9. Accepts K, M, B and T suffixes (any case), decimals such as ``1.8T``."""
    m = _PARAMS.match(text)
    if not m:
        raise ValueError(f'model-params "{text}" is not a parameter count like 7B or 1.5T')
    value = float(m.group(1)) * _PARAM_SCALE[m.group(2).lower()]
    if value <= 0:
        raise ValueError(f'model-params "{text}" must be positive')
    return value


def parse_quantity(text: str | int | float) -> float:
    """A Kubernetes resource quantity (``"500m"``, ``"64Gi"``, ``8``) as a float in base units."""
    if isinstance(text, bool):
        raise ValueError(f"quantity {text!r} is not a number")
    if isinstance(text, int | float):
        if not math.isfinite(text) or text < 0:
            raise ValueError(f"quantity {text!r} must be a finite non-negative number")
        return float(text)
    m = _QTY.match(str(text))
    if not m or m.group(2) not in _QTY_SCALE:
        raise ValueError(f'quantity "{text}" is not a Kubernetes quantity like 500m, 8 or 64Gi')
    return float(m.group(1)) * _QTY_SCALE[m.group(2)]


def parse_positive_number(key: str, text: str, *, allow_zero: bool = False) -> float:
    """A plain number from an annotation, finite and > 0 (or >= 0 with ``allow_zero``)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f'{key} "{text}" is not a number') from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "greater than zero"
        raise ValueError(f'{key} "{text}" must be {bound}')
    return value


def parse_positive_int(key: str, text: str) -> int:
    """A whole number > 0 from an annotation."""
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f'{key} "{text}" is not a whole number') from None
    if value <= 0:
        raise ValueError(f'{key} "{text}" must be greater than zero')
    return value


def parse_bandwidth_tbs(text: str) -> float:
    """``"4.1TB/s"`` or ``"900GB/s"`` -> TB/s. A bare number is read as TB/s."""
    m = _BW.match(text)
    if not m:
        raise ValueError(f'bandwidth "{text}" is not like 3.35TB/s or 900GB/s')
    value = float(m.group(1))
    unit = (m.group(2) or "TB/s").upper()
    if unit.startswith("G"):
        value /= 1000.0
    if value <= 0:
        raise ValueError(f'bandwidth "{text}" must be positive')
    return value


def parse_money(text: str) -> float:
    """``"$2.50"``, ``"2.5"`` or ``"2.5/h"`` -> 2.5 (dollars per hour)."""
    cleaned = text.strip().lstrip("$").removesuffix("/h").removesuffix("/hr").strip()
    return parse_positive_number("hourly-cost", cleaned, allow_zero=True)
