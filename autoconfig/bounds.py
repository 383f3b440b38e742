"""Range checks of the numbers a user gives (options and API arguments alike):
finite and within a range, else a one-line InputError naming the option, the
value and the range. float() takes 'nan' and 'inf', and NaN fails every
comparison: a check written as ``value < 0`` lets it through, and it came out
as NaN results, invalid JSON and a cheapest cell."""

import math
from typing import NamedTuple

from autoconfig.errors import InputError, shown


class Range(NamedTuple):
    """Finite numbers from ``low`` to ``high`` (None: unbounded on that side;
    open ends excluded)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def allows(self, number: float) -> bool:
        low_ok = self.low is None or (number > self.low if self.low_open
                                      else number >= self.low)
        high_ok = self.high is None or (number < self.high if self.high_open
                                        else number <= self.high)
        return math.isfinite(number) and low_ok and high_ok

    def text(self) -> str:
        """'in (0, 1]', 'at least 1 and finite', 'greater than 0 and finite'."""
        if self.low is not None and self.high is not None:
            return (f"in {'(' if self.low_open else '['}{self.low:g}, "
                    f"{self.high:g}{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"{'greater than' if self.low_open else 'at least'} {self.low:g} and finite"
        if self.high is not None:
            return f"{'less than' if self.high_open else 'at most'} {self.high:g} and finite"
        return "a finite number"


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
FRACTION = Range(0, 1, low_open=True)


def check_number(flag: str, value: object, allowed: Range) -> float:
    """``value`` as a float when it is a number ``allowed`` holds, else InputError:
    'invalid --pue nan: must be at least 1 and finite'."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"invalid {flag} {shown(value)}: not a number; must be "
                         f"{allowed.text()}")
    number = float(value)
    if not allowed.allows(number):
        raise InputError(f"invalid {flag} {number:g}: must be {allowed.text()}")
    return number


def check_optional(flag: str, value: object, allowed: Range) -> float | None:
    """``check_number`` where None means "not given"."""
    return None if value is None else check_number(flag, value, allowed)
