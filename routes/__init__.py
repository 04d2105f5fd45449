"""The reference application that ``openroute run`` serves by default (``openroute_reference:registry``).

* ``crm / setCustomer`` and ``crm / createCustomerExtAll`` (routes/mvno.py): billing, then the MNO, obsolete
  detection on the customer; ``setCustomer`` is also fed by the channel ``crm-customers`` when the configuration
  binds it to a connector (``openroute.messaging.incoming.crm-customers.connector = "amqp"``);
  ``crm / changeTariff``: a guaranteed-order funnel per customer;
* ``shop / createOrder`` -> ``shop / createOrderLine`` (routes/orders.py): an order split into its lines.

The billing and MNO endpoints come from ``OPENROUTE_BILLING_URL`` and ``OPENROUTE_MNO_URL`` (their WSDLs from
``OPENROUTE_BILLING_WSDL`` / ``OPENROUTE_MNO_WSDL``, default the files in ``routes/wsdl/``); when an URL is not set,
the in-process fake of routes/fakes.py answers (what the demo and a fresh machine use), and ``openroute run`` mounts
it on its own app under ``/fakes/<name>`` so it can be inspected and told to fail.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from openroute_reference.fakes import FakeSoapSystem, fake_billing, fake_mno
from openroute_reference.mvno import change_tariff_route, customer_route
from openroute_reference.orders import order_routes

from openroute import Application, RouteBuilder
from openroute.outbound import SoapService

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
    billing = SoapService(os.environ.get("OPENROUTE_BILLING_WSDL") or WSDL / "billing.wsdl",
                          address=billing_url or "http://billing.fake/",
                          http_client=billing_fake.client() if billing_fake else None)
    mno = SoapService(os.environ.get("OPENROUTE_MNO_WSDL") or WSDL / "mno.wsdl", address=mno_url or "http://mno.fake/",
                      http_client=mno_fake.client() if mno_fake else None)
    return ReferenceSystems(billing, mno, billing_fake, mno_fake)


def _definitions(systems: ReferenceSystems) -> tuple[RouteBuilder, ...]:
    return (
        # also fed by the queue "crm-customers" when the configuration binds it (docs/channels.md)
        customer_route("setCustomer", systems.billing, systems.mno).from_channel("crm-customers", optional=True),
        customer_route("createCustomerExtAll", systems.billing, systems.mno),
        change_tariff_route(systems.billing),
        *order_routes(),
    )


def build_application(systems: ReferenceSystems | None = None) -> Application:
    """The reference application on ``systems`` (default: :func:`external_systems`)."""
    return Application(*_definitions(systems or external_systems()))


class ReferenceApplication(Application):
    """What ``openroute run`` serves: an :class:`~openroute.dsl.Application` whose ``mounts`` are the fakes in
    use (with a note for each, printed at start), and the ``systems`` its routes call."""

    def __init__(self, systems: ReferenceSystems) -> None:
        mounts, notes = [], []
        for fake in (systems.billing_fake, systems.mno_fake):
            if fake is not None:
                variable = f"OPENROUTE_{fake.name.upper()}_URL"
                mounts.append((f"/fakes/{fake.name}", fake.app()))
                notes.append(f"{variable} is not set: the routes call the in-process fake {fake.name}, mounted "
                             f"at /fakes/{fake.name} (GET /fakes/{fake.name}/calls, "
                             f"POST /fakes/{fake.name}/fail?count=1&kind=transport|fault)")
        super().__init__(*_definitions(systems), mounts=mounts, notes=notes)
        self.systems = systems


def registry() -> ReferenceApplication:
    """What ``openroute run`` loads (a callable, so importing this package stays cheap)."""
    return ReferenceApplication(external_systems())
