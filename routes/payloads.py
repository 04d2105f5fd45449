"""The bodies of the reference routes as pydantic models: one model per message, for the JSON object and the SOAP
request element alike (``.body(Model)``, see docs/routes.md "Typed bodies")."""

from __future__ import annotations

from pydantic import AliasChoices, BaseModel, Field


class Customer(BaseModel):
    """``crm / setCustomer`` and ``crm / createCustomerExtAll``: a customer to set up in billing and on the network."""

    customerId: str = Field(min_length=1, max_length=100)
    msisdn: str = Field(pattern=r"^[0-9]{8,15}$", description="the phone number, 8-15 digits")
    tariff: str = "basic"


class TariffChange(BaseModel):
    """``crm / changeTariff``: a customer's new tariff."""

    customerId: str = Field(min_length=1, max_length=100)
    tariff: str = Field(min_length=1)


class OrderLine(BaseModel):
    """One line of an order; also the body of a ``shop / createOrderLine`` child message (which adds ``orderId``)."""

    sku: str = Field(min_length=1)
    #: checked by the line's step (a quantity <= 0 is a business error reported with the order)
    quantity: int


class Order(BaseModel):
    """``shop / createOrder``: an order of 1-500 lines (``lines`` in JSON, repeated ``line`` elements in SOAP)."""

    orderId: str = Field(min_length=1, max_length=100)
    lines: list[OrderLine] = Field(min_length=1, max_length=500, validation_alias=AliasChoices("lines", "line"))
