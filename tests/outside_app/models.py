"""The booking desk's data: what its tools take and return (a module named like the most common
module of agent code, on purpose: loopwright must not care)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

SLOT = r"^[0-9]{1,4}$"
GUEST = r"^g-[0-9]{1,4}$"


class SlotRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    slot: str = Field(pattern=SLOT, description="A slot number, e.g. 7")


class Booking(BaseModel):
    booking_id: str = Field(pattern=r"^bk_[0-9]+$")
    slot: str
    guest: str


class Slot(BaseModel):
    slot: str
    version: int
    bookings: list[Booking]


class Book(BaseModel):
    model_config = ConfigDict(extra="forbid")

    slot: str = Field(pattern=SLOT)
    guest: str = Field(pattern=GUEST)


class Confirmation(BaseModel):
    confirmation_id: str = Field(pattern=r"^cf_[0-9]+$")
    slot: str
    guest: str
