"""Value checks shared by every validator.

`bool` is a subclass of `int`, so `isinstance(True, int)` holds; option values from JSON, argparse
or keyword arguments must not let `True` stand for 1, hence one definition here.
"""

from __future__ import annotations

import numbers
from typing import TypeGuard

__all__ = ["is_int", "is_number", "is_positive_int"]


def is_int(value: object) -> TypeGuard[int]:
    """True for Python and NumPy integers, False for bools and everything else.

    The guard narrows to `int` because NumPy integers behave as ints wherever we use them
    (comparisons, `range`, indexing).
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_positive_int(value: object, minimum: int = 1) -> TypeGuard[int]:
    """True for an integer (see `is_int`) that is at least `minimum`."""
    return is_int(value) and value >= minimum


def is_number(value: object) -> bool:
    """True for a finite int or float (not a bool, not NaN, not an infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")
