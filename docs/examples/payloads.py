"""Payload types: what a task's fields may be, and what happens to a payload that does not fit."""

from __future__ import annotations

import dataclasses
import enum
from datetime import date, timedelta
from decimal import Decimal
from uuid import UUID

import django_venturi as venturi


# [payload-types]
class Carrier(enum.Enum):
    POST = "post"
    COURIER = "courier"


@dataclasses.dataclass
class Line:
    sku: str
    quantity: int
    unit_price: Decimal


@venturi.task(kind="docs.ship_order", queue="shipping")
@dataclasses.dataclass
class ShipOrder(venturi.Task):
    order_id: UUID
    lines: list[Line]  # nested dataclasses, checked field by field
    carrier: Carrier  # stored as its value, "post" or "courier"
    ship_by: date | None = None  # an optional field
    window: timedelta = timedelta(hours=2)  # stored as microseconds
    partner_token: str = venturi.secret(default="")  # masked in the admin and in errors

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        total = sum(line.quantity * line.unit_price for line in self.lines)
        if total <= 0:
            raise venturi.TaskError.permanent(f"order {self.order_id} has nothing to ship")
        return venturi.Outcome.completed()


# [payload-types end]


# [payload-error]
def enqueue_a_bad_order() -> str:
    """Enqueue an order whose quantity is a string: nothing is written, the error names it."""
    order = ShipOrder(
        order_id=UUID(int=1),
        lines=[Line("tea", 1, Decimal("4.50")), Line("cup", "two", Decimal("3"))],  # type: ignore[arg-type]
        carrier=Carrier.POST,
    )
    try:
        order.enqueue()
    except venturi.PayloadError as error:
        return str(error)  # "ShipOrder.lines[1].quantity: expected int, got str"
    raise AssertionError("the payload was accepted")


# [payload-error end]
