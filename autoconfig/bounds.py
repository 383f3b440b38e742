"""Range checks of the numbers a user gives (options and API arguments alike):
finite and within a range, else a one-line InputError naming the option, the
value and the range. float() takes 'nan' and 'inf', and NaN fails every
comparison: a check written as ``value < 0`` lets it through, and it came out
as NaN results, invalid JSON and a cheapest cell."""

import math
from typing import NamedTuple

from autoconfig.errors import MAX_COUNT, MAX_SEQ_LEN, InputError, shown


def _plain(number: float) -> str:
    """A number as a message shows it: whole numbers in full (1048576, not
    1.04858e+06), others to 6 significant digits."""
    number = float(number)
    if math.isfinite(number) and number.is_integer() and abs(number) < 1e16:
        return str(int(number))
    return f"{number:g}"


class Range(NamedTuple):
    """Finite numbers from ``low`` to ``high`` (None: unbounded on that side;
    open ends excluded); ``whole``: whole numbers only (a count)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    whole: bool = False

    def allows(self, number: float) -> bool:
        low_ok = self.low is None or (number > self.low if self.low_open
                                      else number >= self.low)
        high_ok = self.high is None or (number < self.high if self.high_open
                                        else number <= self.high)
        return (math.isfinite(number) and low_ok and high_ok
                and (not self.whole or float(number).is_integer()))

    def text(self) -> str:
        """'in (0, 1]', 'at least 1 and finite', 'greater than 0 and finite',
        'a whole number in [1, 1048576]'."""
        kind = "a whole number " if self.whole else ""
        if self.low is not None and self.high is not None:
            return (f"{kind}in {'(' if self.low_open else '['}{_plain(self.low)}, "
                    f"{_plain(self.high)}{')' if self.high_open else ']'}")
        if self.low is not None:
            return (f"{kind}{'greater than' if self.low_open else 'at least'} "
                    f"{_plain(self.low)} and finite")
        if self.high is not None:
            return (f"{kind}{'less than' if self.high_open else 'at most'} "
                    f"{_plain(self.high)} and finite")
        return "a finite whole number" if self.whole else "a finite number"


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
FRACTION = Range(0, 1, low_open=True)
COUNT = Range(1, MAX_COUNT, whole=True)
"""A count of things (nodes, GPUs): 1 up to ``errors.MAX_COUNT``."""
SEQ_LEN = Range(1, MAX_SEQ_LEN, whole=True)
"""A sequence length in tokens: 1 up to ``errors.MAX_SEQ_LEN``."""


def check_number(flag: str, value: object, allowed: Range, why: str = "") -> float:
    """``value`` as a float when it is a number ``allowed`` holds, else InputError:
    'invalid --pue nan: must be at least 1 and finite'; ``why`` is said after the
    range ('..., the bf16 peak of h100-80gb')."""
    after = f", {why}" if why else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"invalid {flag} {shown(value)}: not a number; must be "
                         f"{allowed.text()}{after}")
    number = float(value)
    if not allowed.allows(number):
        raise InputError(f"invalid {flag} {_plain(number)}: must be {allowed.text()}{after}")
    return number


def check_optional(flag: str, value: object, allowed: Range, why: str = "") -> float | None:
    """``check_number`` where None means "not given"."""
    return None if value is None else check_number(flag, value, allowed, why)
