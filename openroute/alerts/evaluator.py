"""The alert evaluator of one node: every rule is evaluated by exactly one node per period (a lease in the store),
its state is kept in the store, and its notifications go to every notifier of the rule, each on its own."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from datetime import timedelta

from openroute.alerts.notifiers import Notification, Notifier
from openroute.alerts.rules import AlertRule, decide, rules_by_name
from openroute.definitions.clock import Clock, SystemClock
from openroute.definitions.errors import ConfigurationError
from openroute.persistence import MessageStore
from openroute.persistence.alerts import AlertStateStore
from openroute.persistence.outage import StoreOutage, is_store_unreachable, run_passes

__all__ = ["AlertEvaluator"]

log = logging.getLogger("openroute.alerts")


class AlertEvaluator:
    """Evaluates the enabled ``rules`` on ``store`` as node ``node_id`` and sends their notifications.

    Every node of a cluster may run one: the lease makes one node evaluate each rule per ``rule.interval``.
    """

    def __init__(self, store: MessageStore, rules: Iterable[AlertRule], notifiers: Sequence[Notifier], *,
                 node_id: str, clock: Clock | None = None) -> None:
        self.store = store
        self.rules = [rule for rule in rules_by_name(list(rules)).values() if rule.enabled]
        self.notifiers = {notifier.name: notifier for notifier in notifiers}
        unknown = sorted({name for rule in self.rules for name in rule.notifiers} - set(self.notifiers))
        if unknown:
            raise ConfigurationError(f"alert rules name notifiers that are not configured: {unknown}")
        self.node_id = node_id
        self.clock: Clock = clock or SystemClock()
        self.states = AlertStateStore(store)
        #: whether the evaluations find the store unreachable (persistence/outage.py)
        self.outage = StoreOutage.of_loop("alert evaluator")

    async def evaluate_once(self) -> list[Notification]:
        """Evaluate every rule whose lease this node wins now; returns the notifications sent (or tried).

        Raises SQLAlchemy's error when the store is unreachable (:func:`~openroute.persistence.is_store_unreachable`:
        the other rules would fail the same way); a rule that fails otherwise is logged and skipped."""
        sent: list[Notification] = []
        for rule in self.rules:
            try:
                notification = await asyncio.to_thread(self._evaluate, rule)
            except Exception as error:  # one broken rule (bad SQL) must not stop the others
                if is_store_unreachable(error):
                    raise
                log.warning("alert rule %s could not be evaluated: %s: %s", rule.name, type(error).__name__, error)
                continue
            if notification is not None:
                await self._send(rule, notification)
                sent.append(notification)
        return sent

    def _evaluate(self, rule: AlertRule) -> Notification | None:
        now = self.clock.now()
        # a little short of the interval, so the next period's evaluation is not lost to timer jitter
        until = now + rule.interval - min(rule.interval / 10, timedelta(seconds=1))
        state = self.states.take_lease(rule.name, self.node_id, now, until)
        if state is None:
            return None  # another node evaluates it this period
        with self.store.engine.connect() as connection:
            value = rule.value(connection, now)
        new, kind = decide(rule, state, value, now)
        if not self.states.save(new, self.node_id) or kind is None:
            return None
        return Notification(rule.name, kind, value, rule.limit, now, rule.description, self.node_id)

    async def _send(self, rule: AlertRule, notification: Notification) -> None:
        targets = [self.notifiers[name] for name in rule.notifiers] if rule.notifiers else list(self.notifiers.values())

        async def one(notifier: Notifier) -> None:
            try:
                await notifier.notify(notification)
            except Exception as error:
                log.warning("notifier %s could not send %s: %s: %s", notifier.name, notification.summary(),
                            type(error).__name__, error)

        await asyncio.gather(*(one(notifier) for notifier in targets))

    async def run(self, stop: asyncio.Event, tick: float | None = None) -> None:
        """Evaluate until ``stop`` is set, every ``tick`` seconds (default: the shortest rule interval, at most 10);
        while the store is unreachable the log gets one WARNING, one INFO when it is back (``self.outage``), and the
        evaluations back off."""
        if not self.rules:
            return
        period = tick if tick is not None else min(min(r.interval for r in self.rules).total_seconds(), 10.0)
        await run_passes(self.evaluate_once, period, stop, self.outage, "alert evaluation failed", log)
