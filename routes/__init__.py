"""The reference application that ``openroute run`` serves by default (``routes:registry``).

* ``crm / setCustomer`` and ``crm / createCustomerExtAll`` (routes/mvno.py): billing, then the MNO, obsolete
  detection on the customer; ``crm / changeTariff``: a guaranteed-order funnel per customer;
* ``shop / createOrder`` -> ``shop / createOrderLine`` (routes/orders.py): an order split into its lines.

The billing and MNO endpoints come from ``OPENROUTE_BILLING_URL`` and ``OPENROUTE_MNO_URL``; when they are not set,
the in-process fakes of routes/fakes.py answer (what the demo and a fresh machine use).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from openroute.dsl import Application
from openroute.outbound import SoapService
from routes.fakes import FakeSoapSystem, fake_billing, fake_mno
from routes.mvno import change_tariff_route, customer_route
from routes.orders import order_routes

WSDL = Path(__file__).resolve().parent / "wsdl"


@dataclass
class ReferenceSystems:
    """The external systems the reference routes call, and the fakes behind them (None when real)."""

    billing: SoapService
    mno: SoapService
    billing_fake: FakeSoapSystem | None = None
    mno_fake: FakeSoapSystem | None = None


def external_systems(billing_url: str | None = None, mno_url: str | None = None) -> ReferenceSystems:
    """SOAP clients of billing and the MNO: the given URLs, else the in-process fakes."""
    billing_url = billing_url or os.environ.get("OPENROUTE_BILLING_URL")
    mno_url = mno_url or os.environ.get("OPENROUTE_MNO_URL")
    billing_fake = None if billing_url else fake_billing()
    mno_fake = None if mno_url else fake_mno()
    billing = SoapService(WSDL / "billing.wsdl", address=billing_url or "http://billing.fake/billing",
                          http_client=billing_fake.client() if billing_fake else None)
    mno = SoapService(WSDL / "mno.wsdl", address=mno_url or "http://mno.fake/mno",
                      http_client=mno_fake.client() if mno_fake else None)
    return ReferenceSystems(billing, mno, billing_fake, mno_fake)


def build_application(systems: ReferenceSystems | None = None) -> Application:
    """The reference application on ``systems`` (default: :func:`external_systems`)."""
    systems = systems or external_systems()
    return Application(
        customer_route("setCustomer", systems.billing, systems.mno),
        customer_route("createCustomerExtAll", systems.billing, systems.mno),
        change_tariff_route(systems.billing),
        *order_routes(),
    )


def registry() -> Application:
    """``routes:registry``: what ``openroute run`` loads (a callable, so importing this package stays cheap)."""
    return build_application()
