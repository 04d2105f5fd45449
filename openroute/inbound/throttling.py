"""Throttling of inbound requests per source system and operation, as OpenHub's ``throttling.<system>.<operation>``.

Rules map ``system.operation`` (either part ``*``) to ``limit/interval``: at most ``limit`` requests per fixed
window of ``interval`` (seconds, or a duration such as ``60s``, ``1m``). The most specific rule of a request
applies: ``CRM.setCustomer`` over ``CRM.*`` over ``*.setCustomer`` over ``*.*``. Whatever rule applies, requests
are counted per real source system and operation (``*.*`` = 60/60 gives every system 60 per minute for each of its
operations). A request over the limit is refused (:class:`~openroute.definitions.errors.ThrottledError`: HTTP 429 with
``Retry-After``, SOAP fault ``THROTTLED``) before anything is stored, and is not counted. The counters live in the
store (:class:`~openroute.persistence.ThrottleCounters`), so all nodes on one database share them. A busy node takes
permits a little ahead of its requests and spends them without the store (:class:`Throttling`): a window never
admits more than its limit across nodes.

    from openroute.inbound.throttling import Throttling
    throttling = Throttling.from_rules({"CRM.setCustomer": "10/60", "*.*": "100/60s"}, store)
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from openroute.definitions.errors import ConfigurationError, StoreUnavailableError, ThrottledError
from openroute.persistence import MessageStore, ThrottleCounters

__all__ = ["ThrottleRule", "Throttling", "parse_rules"]

WILDCARD = "*"
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_VALUE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


@dataclass(frozen=True)
class ThrottleRule:
    """At most ``limit`` requests per ``interval`` seconds for ``source_system`` / ``operation`` (``*``: any)."""

    source_system: str
    operation: str
    limit: int
    interval: float

    def __post_init__(self) -> None:
        key = f"throttling.{self.source_system}.{self.operation}"
        if not self.source_system or not self.operation:
            raise ConfigurationError(f"{key}: the system and the operation must not be empty (use '*')")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ConfigurationError(f"{key}: the limit must be an integer >= 1, got {self.limit!r}")
        if not self.interval >= 0.001:
            raise ConfigurationError(f"{key}: the interval must be at least 1 ms, got {self.interval!r} s")

    @property
    def specificity(self) -> int:
        """3 for an exact rule, 2 for ``system.*``, 1 for ``*.operation``, 0 for ``*.*``."""
        return (2 if self.source_system != WILDCARD else 0) + (1 if self.operation != WILDCARD else 0)


def _rule(system: str, operation: str, value: object) -> ThrottleRule:
    if not isinstance(value, str) or (match := _VALUE.match(value)) is None:
        raise ConfigurationError(
            f"throttling.{system}.{operation}: expected 'limit/interval' such as '60/60' or '10/1m', got {value!r}")
    limit, amount, unit = match.groups()
    return ThrottleRule(system, operation, int(limit), float(amount) * _UNITS[unit or "s"])


def parse_rules(rules: Mapping[str, object]) -> list[ThrottleRule]:
    """The rules of the ``[throttling]`` table: ``{"CRM": {"setCustomer": "10/60"}}`` (TOML
    ``throttling.CRM.setCustomer = "10/60"``) or flat ``{"CRM.setCustomer": "10/60"}``. Raises ConfigurationError
    naming every bad key."""
    parsed: list[ThrottleRule] = []
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    for key, value in rules.items():
        items: Iterable[tuple[str, str, object]]
        if isinstance(value, Mapping):
            items = [(key, operation, limit) for operation, limit in value.items()]
        else:
            system, dot, operation = key.partition(".")
            if not dot:
                problems.append(f"throttling.{key}: give 'system.operation = \"limit/interval\"' "
                                f"or a [throttling.{key}] table")
                continue
            items = [(system, operation, value)]
        for system, operation, limit in items:
            try:
                rule = _rule(str(system), str(operation), limit)
            except ConfigurationError as error:
                problems.append(str(error))
                continue
            if (rule.source_system, rule.operation) in seen:
                problems.append(f"throttling.{system}.{operation}: given twice")
                continue
            seen.add((rule.source_system, rule.operation))
            parsed.append(rule)
    if problems:
        raise ConfigurationError("\n".join(problems))
    return parsed


#: a node takes ahead, beside what its waiting requests need, the permits its recent rate will use in this many seconds
LEASE_SECONDS = 1.0
#: and holds (spendable, or being taken) at most the limit divided by this: what a node holds unspent when its
#: requests stop is at most 5 %
LEASE_SHARE = 20
#: the (system, operation) pairs remembered: beyond this many, those holding no permits are forgotten
MAX_KEYS = 10_000


class _Lease:
    """One source system and operation on this node: its rule, the permits this node took and has not spent yet,
    and its recent rate."""

    __slots__ = ("arrivals", "cap", "full", "limit", "low", "operation", "permits", "refilling", "rule", "since",
                 "source_system", "window", "window_ms")

    def __init__(self, source_system: str, operation: str, rule: ThrottleRule) -> None:
        self.source_system, self.operation, self.rule = source_system, operation, rule
        self.limit = rule.limit
        self.window_ms = max(1, int(rule.interval * 1000))
        #: permits held or being taken ahead at most (0: every request is counted in the store)
        self.cap = rule.limit // LEASE_SHARE
        #: the window the permits belong to (they expire with it), and how many are left
        self.window = -1
        self.permits = 0
        #: a background reservation starts when the permits fall to this (half of those held after the last one)
        self.low = 0
        self.refilling = False
        #: the window the store said is full (counts only grow in a window: it stays full)
        self.full = -1
        #: requests since the last reservation, and when it was made (the throttling's clock; None before the first)
        self.arrivals = 0
        self.since: float | None = None

    def spend(self, window: int) -> bool:
        """Spend a permit of ``window`` if one is held."""
        if self.window != window or self.permits <= 0:
            return False
        self.permits -= 1
        return True

    def ahead(self, window: int, now: float) -> int:
        """How many permits of ``window`` to take at ``now`` beside those needed: ``LEASE_SECONDS`` at the rate
        since the last reservation, at most ``cap`` with those held (none for a limit under ``LEASE_SHARE``: counted
        exactly, request by request; none at the first reservation: no rate yet). Starts the next rate measurement."""
        since, arrivals = self.since, self.arrivals
        self.since, self.arrivals = now, 0
        if since is None or now <= since:
            return 0
        held = self.permits if self.window == window else 0
        return max(0, min(int(arrivals / (now - since) * LEASE_SECONDS), self.cap - held))

    def keep(self, window: int, permits: int) -> None:
        """Hold ``permits`` more of ``window`` (those of an earlier window are dropped)."""
        if self.window != window:
            self.window, self.permits = window, 0
        self.permits += permits


#: an item waiting for the next counting transaction: the lease, the window, and the request's future (None: a
#: background reservation of permits ahead)
_Pending = tuple[_Lease, int, "asyncio.Future[bool] | None"]


class Throttling:
    """The throttling rules of the inbound endpoints and their shared counters (see the module doc).

    ``clock`` gives seconds since the epoch (the nodes share the windows, so it is wall-clock time).

    Under a steady load a node does not count every request in the store. When it must count, it takes the permits
    its waiting requests need plus what its recent rate will use in ``LEASE_SECONDS``, and spends those without the
    store; when they fall to half of what it held after its last reservation, it takes the next ones in the
    background, so its requests do not wait for the store. What it holds (spendable or being taken) is at most
    ``limit // LEASE_SHARE``, and nothing for a smaller limit. The limit stays exact across nodes, as a node spends
    only permits the shared counter gave it; a node whose requests stop while it holds some leaves them unspent
    (they expire with the window), so a window can admit a few fewer than the limit, never more. Once the store says
    a window is full, the node refuses the rest of that window's requests without asking it again (a window's count
    only grows).
    """

    def __init__(self, rules: Iterable[ThrottleRule], counters: ThrottleCounters,
                 clock: Callable[[], float] = time.time) -> None:
        self.rules = {(rule.source_system, rule.operation): rule for rule in rules}
        self.counters = counters
        self.clock = clock
        # requests (and background reservations) waiting for the next counting transaction, and whether one runs
        self._pending: list[_Pending] = []
        self._counting = False
        self._counter_task: asyncio.Future[None] | None = None
        # per real (system, operation): its lease, None when no rule applies (the rule lookup is made once)
        self._leases: dict[tuple[str, str], _Lease | None] = {}
        #: counting transactions made (each takes the permits of one batch of waiting requests)
        self.reservations = 0
        #: requests that waited for a counting transaction (the others were admitted from held permits)
        self.waits = 0

    @classmethod
    def from_rules(cls, rules: Mapping[str, object], store: MessageStore,
                   clock: Callable[[], float] = time.time) -> Throttling:
        """Throttling by the ``[throttling]`` table ``rules`` (see :func:`parse_rules`) with counters in ``store``."""
        return cls(parse_rules(rules), ThrottleCounters(store), clock)

    def rule_for(self, source_system: str, operation: str) -> ThrottleRule | None:
        """The most specific rule of a request (exact, ``system.*``, ``*.operation``, ``*.*``), None if none."""
        rules = self.rules
        return (rules.get((source_system, operation)) or rules.get((source_system, WILDCARD))
                or rules.get((WILDCARD, operation)) or rules.get((WILDCARD, WILDCARD)))

    def _lease(self, key: tuple[str, str]) -> _Lease | None:
        """The lease of a (system, operation) seen for the first time (None without a rule), remembered."""
        leases = self._leases
        if len(leases) >= MAX_KEYS:  # many source systems (a header, unless authenticated): forget the idle ones
            for idle in [k for k, lease in leases.items() if lease is None or not (lease.permits or lease.refilling)]:
                del leases[idle]
        rule = self.rule_for(*key)
        lease = leases[key] = None if rule is None else _Lease(*key, rule)
        return lease

    async def counted(self) -> None:
        """Return once the requests and background reservations waiting so far are counted (none may be)."""
        while (task := self._counter_task) is not None and not task.done():
            await asyncio.shield(task)

    def _enqueue(self, item: _Pending) -> None:
        self._pending.append(item)
        if not self._counting:
            self._counting = True
            self._counter_task = asyncio.ensure_future(self._count())

    async def _count(self) -> None:
        """Count the waiting requests, in one transaction per batch (those that arrive meanwhile wait for the next):
        a transaction per request cost a third of the inbound throughput (docs/performance.md)."""
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                await self._count_batch(batch)
        finally:
            self._counting = False

    async def _count_batch(self, batch: list[_Pending]) -> None:
        """Admit the requests of ``batch`` from held permits, else from one reservation for all of them (with the
        permits taken ahead, and the background reservations of the batch)."""
        groups: dict[tuple[_Lease, int], list[asyncio.Future[bool]]] = {}
        refills: set[tuple[_Lease, int]] = set()
        for lease, window, future in batch:
            futures = groups.setdefault((lease, window), [])
            if future is None:
                refills.add((lease, window))
            elif not future.done():
                futures.append(future)
        now = self.clock()
        now_ms = int(now * 1000)
        blocks: list[tuple[_Lease, int, list[asyncio.Future[bool]], int]] = []
        for (lease, window), futures in groups.items():
            while futures and lease.spend(window):  # permits taken since these requests queued
                futures.pop(0).set_result(True)
            if futures:
                blocks.append((lease, window, futures, len(futures) + lease.ahead(window, now)))
            elif ((lease, window) in refills and lease.full != window
                  and window == now_ms - now_ms % lease.window_ms  # not for a window that has ended
                  and (ahead := lease.ahead(window, now))):
                blocks.append((lease, window, futures, ahead))
        try:
            if blocks:
                await self._reserve(blocks)
        finally:
            for lease, _ in refills:
                lease.refilling = False

    async def _reserve(self, blocks: list[tuple[_Lease, int, list[asyncio.Future[bool]], int]]) -> None:
        self.reservations += 1
        store = self.counters.store
        try:
            granted = await asyncio.to_thread(
                self.counters.reserve_many,
                [(lease.source_system, lease.operation, window, lease.limit, wanted)
                 for lease, window, _, wanted in blocks])
        except Exception as error:
            unreachable = store.outage.failed(error, "counting a request for throttling")
            for future in (future for _, _, futures, _ in blocks for future in futures):
                if not future.done():
                    future.set_exception(StoreUnavailableError() if unreachable else error)
            return
        store.outage.succeeded()
        for (lease, window, futures, wanted), admitted in zip(blocks, granted, strict=True):
            waiting = [future for future in futures if not future.done()]  # a request gone meanwhile leaves its permit
            for index, future in enumerate(waiting):
                future.set_result(index < admitted)
            taken_ahead = max(0, admitted - len(waiting))
            lease.keep(window, taken_ahead)
            lease.low = lease.permits // 2
            if admitted < wanted:
                lease.full = window

    async def check(self, source_system: str, operation: str) -> None:
        """Count a request of ``source_system`` / ``operation`` under its rule (nothing to do without one).

        Raises :class:`ThrottledError` when the window is full (the request is not counted) and
        :class:`StoreUnavailableError` when the counters cannot be reached (nothing counted)."""
        key = (source_system, operation)
        lease = self._leases.get(key)
        if lease is None and (key in self._leases or (lease := self._lease(key)) is None):
            return
        now = self.clock()
        now_ms = int(now * 1000)
        window = now_ms - now_ms % lease.window_ms
        lease.arrivals += 1
        if lease.window == window and lease.permits > 0:
            lease.permits -= 1
            if lease.permits <= lease.low and lease.cap and not lease.refilling:
                lease.refilling = True  # the next permits, taken while these are spent
                self._enqueue((lease, window, None))
            return
        if lease.full != window:
            future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._enqueue((lease, window, future))
            self.waits += 1
            if await future:
                return
        raise ThrottledError(source_system, operation, lease.limit, lease.rule.interval,
                             max(1, math.ceil((window + lease.window_ms) / 1000 - now)))
