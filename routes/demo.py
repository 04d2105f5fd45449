"""``openroute demo``: the reference routes on a temporary SQLite store, messages driven through every state.

It lives with the reference application it shows; the ``openroute`` CLI loads it by name, as ``openroute run``
loads ``openroute_reference:registry``.

Nothing waits for real time: the engine runs on a manual clock that the demo moves forward, and the external
systems are the in-process fakes of ``routes/fakes.py``. Each committed state change is printed as it happens;
a table of every message and its path through the states ends the run.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TextIO

from openroute import MessageState

if TYPE_CHECKING:
    from openroute.persistence import StoredMessage

S = MessageState
MVNO = "http://openroute.dev/mvno"


@dataclass
class DemoReport:
    """What the demo saw: each message's path through the states, and the final states in the store."""

    paths: dict[int, list[MessageState]] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)
    final_states: dict[int, MessageState] = field(default_factory=dict)

    @property
    def states_seen(self) -> set[MessageState]:
        """Every state some message was in."""
        return {state for path in self.paths.values() for state in path}


def _customer(customer: str, operation: str = "setCustomer") -> str:
    return (f'<m:{operation}Request xmlns:m="{MVNO}"><m:customerId>{customer}</m:customerId>'
            f"<m:msisdn>420777123456</m:msisdn><m:tariff>unlimited</m:tariff></m:{operation}Request>")


def _shown(path: list[MessageState]) -> str:
    """The path with a repeated retry cycle shortened: ``PARTLY_FAILED -> PROCESSING (x4)``."""
    parts: list[str] = []
    index = 0
    while index < len(path):
        pair = path[index:index + 2]
        repeats = 1
        while len(pair) == 2 and path[index + 2 * repeats:index + 2 * repeats + 2] == pair:
            repeats += 1
        if repeats > 1:
            parts.append(f"({pair[0].value} -> {pair[1].value}) x{repeats}")
            index += 2 * repeats
        else:
            parts.append(path[index].value)
            index += 1
    return " -> ".join(parts)


async def run_demo(out: TextIO = sys.stdout, database_url: str | None = None) -> DemoReport:
    """Run the demo, printing to ``out``; returns the :class:`DemoReport`. The store is a temporary SQLite file
    removed at the end unless ``database_url`` names one (to look at it afterwards)."""
    from openroute_reference import build_application, external_systems

    from openroute.outbound import ExternalSystem
    from openroute.testing import RouteTestKit

    systems = external_systems(None, None)
    assert systems.billing_fake is not None and systems.mno_fake is not None  # noqa: S101  narrows an Optional for mypy: set before this point
    report = DemoReport()
    sending: list[str] = []  # the label of the message being sent (its NEW is committed before its id is known)
    say = _printer(out)

    def trace(previous: MessageState | None, message: StoredMessage) -> None:
        report.paths.setdefault(message.id, [])  # filled from message_transition at the end
        if previous is None and sending and message.parent_id is None:
            report.labels.setdefault(message.id, sending[0])
        label = report.labels.get(message.id, f"{message.operation} {message.correlation_id}")
        arrow = f"{previous.value:>20} -> " if previous is not None else " " * 24
        shown = (S.PARTLY_FAILED, S.POSTPONED, S.SKIPPED, S.FAILED)
        detail = f"  ({message.last_error_code})" if message.last_error_code and message.state in shown else ""
        say(f"  #{message.id:<3} {label:<34} {arrow}{message.state.value}{detail}")

    async def send(label: str, coroutine: object) -> int:
        sending[:] = [label]
        try:
            sent = await coroutine  # type: ignore[misc]
        finally:
            sending.clear()
        if sent.message_id is None:
            raise RuntimeError(f"{label} was refused: {sent.status_code} {sent.body}")
        report.labels[sent.message_id] = label
        return int(sent.message_id)

    application = build_application(systems)
    # declared, as openroute.toml would: their calls pass the breakers (closed all along: the demo is too short)
    declared = {name: ExternalSystem(name) for name in ("BILLING", "MNO")}
    async with RouteTestKit(application, database_url=database_url, external_systems=declared) as kit:
        kit.engine.on_transition(trace)
        say("openroute demo: reference routes on a temporary SQLite store, fake billing and MNO, manual clock\n")
        retried = await _steps_1_to_4(kit, systems, send, say)
        await _steps_5_to_8(kit, systems, send, say)
        await _from_a_queue(kit, application, say, sending)
        _summarize(kit, report, say, retried)
    await systems.billing.aclose()
    await systems.mno.aclose()
    return report


Send = Callable[[str, object], Awaitable[int]]


def _printer(out: TextIO) -> Callable[[str], None]:
    """Prints a line to ``out``; once the reader has gone (``openroute demo | head``), finishes quietly."""
    closed: list[bool] = []

    def say(text: str) -> None:
        if closed:
            return
        try:
            print(text, file=out, flush=True)
        except BrokenPipeError:  # `openroute demo | head`: the reader left; finish quietly
            closed.append(True)
            if out is sys.stdout:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    return say


async def _steps_1_to_4(kit: Any, systems: Any, send: Send, say: Callable[[str], None]) -> int:
    """A message through billing and the MNO, a retry, guaranteed order, an obsolete message; returns the id of
    the message retried in step 2."""
    say("1. setCustomer C-100 over SOAP: billing, then the MNO")
    await send("setCustomer C-100", kit.send_soap("crm", _customer("C-100"), correlation_id="demo-1",
                                                   source_system="CRM"))
    await kit.settle()

    say("\n2. setCustomer C-200 while the MNO is down once: retried 30 s later, billing is not called again")
    systems.mno_fake.fail_next(1)
    retried = await send("setCustomer C-200", kit.send_json(
        "crm", "setCustomer", {"customerId": "C-200", "msisdn": "420777000200"}, correlation_id="demo-2",
        source_system="CRM"))
    await kit.settle()
    await kit.advance(timedelta(seconds=30))
    say(f"     billing calls for C-200: {systems.billing_fake.calls['C-200']}, "
        f"MNO calls: {systems.mno_fake.calls['C-200']}")

    say("\n3. two tariff changes of C-300 (guaranteed order): the newer waits while the older is retried")
    systems.billing_fake.fail_next(1)
    await send("changeTariff C-300 (older)", kit.send_json(
        "crm", "changeTariff", {"customerId": "C-300", "tariff": "gold"}, correlation_id="demo-3a",
        source_system="CRM"))
    await kit.settle()
    kit.clock.advance(timedelta(seconds=1))
    await send("changeTariff C-300 (newer)", kit.send_json(
        "crm", "changeTariff", {"customerId": "C-300", "tariff": "platinum"}, correlation_id="demo-3b",
        source_system="CRM"))
    await kit.settle()
    for _ in range(3):
        await kit.advance(timedelta(seconds=30))

    say("\n4. obsolete: MSG2 for C-400 fails, then a newer MSG3 (createCustomerExtAll) ends OK first")
    await send("setCustomer C-400 MSG1", kit.send_soap("crm", _customer("C-400"), correlation_id="demo-4a"))
    await kit.settle()
    kit.clock.advance(timedelta(seconds=1))
    systems.mno_fake.fail_next(1)
    await send("setCustomer C-400 MSG2", kit.send_soap("crm", _customer("C-400"), correlation_id="demo-4b"))
    await kit.settle()
    kit.clock.advance(timedelta(seconds=1))
    await send("createCustomerExtAll C-400 MSG3", kit.send_soap(
        "crm", _customer("C-400", "createCustomerExtAll"), correlation_id="demo-4c"))
    await kit.settle()
    await kit.advance(timedelta(seconds=30))

    return retried


async def _steps_5_to_8(kit: Any, systems: Any, send: Send, say: Callable[[str], None]) -> None:
    """A business error, an operator's cancel, attempts exhausted, a split order."""
    say("\n5. setCustomer for a blocked customer: billing answers a SOAP Fault, a business error")
    await send("setCustomer blocked-500", kit.send_json(
        "crm", "setCustomer", {"customerId": "blocked-500", "msisdn": "420777000500"}, correlation_id="demo-5"))
    await kit.settle()

    say("\n6. an operator cancels a message that is waiting for its next attempt")
    systems.mno_fake.fail_next(1)
    waiting = await send("setCustomer C-600", kit.send_json(
        "crm", "setCustomer", {"customerId": "C-600", "msisdn": "420777000600"}, correlation_id="demo-6"))
    await kit.settle()
    await kit.engine.cancel(waiting)

    say("\n7. setCustomer C-800 while the MNO stays down: every attempt fails, the last one ends FAILED")
    systems.mno_fake.fail_next(100)
    exhausted = await send("setCustomer C-800", kit.send_json(
        "crm", "setCustomer", {"customerId": "C-800", "msisdn": "420777000800"}, correlation_id="demo-8"))
    await kit.settle()
    await kit.run_until_final(exhausted, step=timedelta(minutes=10))
    systems.mno_fake.fail_next(0)
    say(f"     MNO calls for C-800: {systems.mno_fake.calls['C-800']} (the route allows 5 attempts)")

    say("\n8. an order split into its lines: the order waits for them, then ends OK")
    await send("createOrder O-700", kit.send_json(
        "shop", "createOrder", {"orderId": "O-700", "lines": [{"sku": "SIM", "quantity": 1},
                                                              {"sku": "PHONE", "quantity": 1}]},
        correlation_id="demo-7", source_system="SHOP"))
    await kit.settle()


def _summarize(kit: Any, report: DemoReport, say: Callable[[str], None], retried: int) -> None:
    """Fill the report from the store and print every message's path through the states."""
    for message_id in report.paths:
        report.final_states[message_id] = kit.state(message_id)
        # the path as the store recorded it, one message_transition row per state change
        report.paths[message_id] = [row["to_state"] for row in kit.engine.store.transitions.of(message_id)]
    say("\nmessage  what                                  path")
    for message_id, path in sorted(report.paths.items()):
        label = report.labels.get(message_id, f"(line of order) #{kit.message(message_id).parent_id}")
        say(f"  #{message_id:<5} {label:<36} {_shown(path)}")
    missing = [s.value for s in MessageState if s not in report.states_seen]
    say(f"\nstates seen: {len(report.states_seen)} of {len(MessageState)}"
        + (f" (missing: {', '.join(missing)})" if missing else " - every state") + f"; retried message "
        f"#{retried} ended {kit.state(retried).value}; in the store: {kit.count_by_state()}")


async def _from_a_queue(kit: Any, application: Any, say: Callable[[str], None], sending: list[str]) -> None:
    """Step 9: a message from the queue ``crm-customers`` (the in-memory connector), acked after its commit, and
    the outcome event its final state writes to the outbox, published to ``crm-events``."""
    import json

    from openroute.testing import KitChannels

    config = {
        "openroute.messaging.incoming.crm-customers.connector": "in-memory",
        "openroute.messaging.incoming.crm-customers.source-system": "CRM",
        "openroute.messaging.outgoing.crm-events.connector": "in-memory",
        "openroute.messaging.outgoing.crm-events.outcome-events": "final",
    }
    say("\n9. setCustomer C-900 from the queue crm-customers: stored, then acked; its outcome event published")
    async with KitChannels(kit, application, config) as channels:
        sending[:] = ["setCustomer C-900 (queue)"]
        body = json.dumps({"customerId": "C-900", "msisdn": "420777000900"})
        await channels.send("crm-customers", body, message_id="demo-9")
        sending.clear()
        say("     acked to the queue after the commit")
        await kit.settle()
        await channels.publish_outcomes()
        for payload in channels.published("crm-events"):
            event = json.loads(payload)
            say(f"     event on crm-events: {event['service']}/{event['operation']} {event['correlationId']} "
                f"{event['state']}")


def main() -> int:
    """Entry point of ``openroute demo``: 0 when every state was shown."""
    report = asyncio.run(run_demo())
    return 0 if report.states_seen == set(MessageState) else 1
