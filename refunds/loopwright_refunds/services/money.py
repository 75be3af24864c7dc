"""Money on the wire is a decimal string with two places ("100.00"); in storage it is cents.

Integer cents keep sums exact in SQLite; the string form keeps JSON clients away from floats.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from loopwright_refunds.services.errors import ServiceError

_CENT = Decimal("0.01")


def to_cents(amount: Decimal | str) -> int:
    """Parse an amount, refusing anything that is not a whole number of cents."""
    try:
        value = Decimal(amount)
    except InvalidOperation:
        value = Decimal("NaN")
    if not value.is_finite() or value != value.quantize(_CENT):
        raise ServiceError(422, "invalid_amount", f"{amount!s} is not an amount with two decimals")
    return int(value * 100)


def format_cents(cents: int) -> str:
    """The wire form of an amount: 10000 -> "100.00"."""
    return str(Decimal(cents).scaleb(-2))
