"""Test doubles for route authors: run your routes for real in a test, without a server and without sleeping.

    from openroute.testing import CallRecorder, FakeHttpService, FakeSoapService, RouteTestKit

::

    async def test_customer_is_set(route_test_kit):
        billing = CallRecorder(fail_first=1)                      # fails once, then answers {"ok": True}
        kit = await route_test_kit(build_application(billing))   # engine + temporary SQLite + manual clock
        sent = await kit.send_json("crm", "setCustomer", {"customer": {"id": "C-1"}})
        await kit.settle()
        kit.assert_state(sent.message_id, "PARTLY_FAILED")
        await kit.advance(minutes=1)                              # the clock moves, repoll runs, work settles
        kit.assert_state(sent.message_id, "OK")
        assert billing.calls == 2

A kit (:class:`RouteTestKit`) serves the application's real inbound endpoints in-process (an ASGI transport: every
request goes through the same validation, extraction and error answers as under ``openroute run``), on an engine
with its in-memory processing channel, a :class:`~openroute.definitions.clock.ManualClock` and no repoll scheduler:
:meth:`RouteTestKit.advance` moves the clock and runs the repoll itself. The database is a temporary SQLite file
unless a URL is given (the same code path as PostgreSQL). The ``route_test_kit`` pytest fixture (registered through
the ``pytest11`` entry point, so every project that installs openroute has it) creates kits and closes them after
the test.

A route written with the shipped clients is tested as it is: the kit takes fakes of its external systems by name
(``external_systems={"PAYMENTS": FakeHttpService(...)}``, :class:`FakeSoapService` for a WSDL), and the calls of
``ext_call(..., system="PAYMENTS")`` reach the fake through the system's breaker, timeout and records instead of
the network. :class:`CallRecorder` is a fake for a step that takes a plain function.

Routes fed by a broker channel, and the outcome events of final states, run on a kit's engine with
:class:`KitChannels` (the in-memory connector: put a delivery on a channel, read what was published).
"""

from openroute.testing import _plugin
from openroute.testing._channels import KitChannels
from openroute.testing._fake_http import FakeHttpService
from openroute.testing._fake_soap import FakeSoapService
from openroute.testing._fakes import FakeRemote, FakeRequest
from openroute.testing._kit import RecordedCall, RouteTestKit, SendResult
from openroute.testing._plugin import route_test_kit
from openroute.testing._recorder import CallRecorder

__all__ = [
    "CallRecorder",
    "FakeHttpService",
    "FakeRemote",
    "FakeRequest",
    "FakeSoapService",
    "KitChannels",
    "RecordedCall",
    "RouteTestKit",
    "SendResult",
    "route_test_kit",
]

if hasattr(_plugin, "pytest_pycollect_makeitem"):  # pytest is installed: the hook of the pytest11 plugin
    pytest_pycollect_makeitem = _plugin.pytest_pycollect_makeitem
