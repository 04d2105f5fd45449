"""Confirmation callbacks: what runs once a message has reached OK, FAILED or CANCEL."""

from __future__ import annotations

import abc
import logging
from collections.abc import Iterable

from openroute.confirmation.model import ConfirmationRequest, InvalidConfirmationError

log = logging.getLogger("openroute.confirmation")


class ConfirmationCallback(abc.ABC):
    """Tells a source system the final outcome of one of its messages.

    :meth:`confirm` returns normally when the confirmation was delivered and raises (typically
    :class:`~confirmation.ConfirmationSendError`) when it was not; the :class:`~confirmation.ConfirmationService`
    then retries it on its own schedule, from the durable row it keeps per confirmation (see :attr:`durable`).
    """

    @property
    def durable(self) -> bool:
        """Whether its confirmations are kept as rows: written in the transaction that makes the message final, sent
        after the commit, leased, retried on failure and recorded SENT, so none is lost to a crash or a failed send
        (the default).

        ``False`` for a callback whose confirmation cannot fail and needs no retry, such as a log line: it is called
        once per confirmed message straight from the final-state hook after the commit, with no row, no claim and
        no record; an exception it raises is logged and not retried, and a node that dies between the final commit
        and the call leaves that confirmation unmade.
        """
        return True

    @abc.abstractmethod
    async def confirm(self, request: ConfirmationRequest) -> None:
        """Deliver one confirmation; raise if it did not arrive."""

    def confirms(self, source_system: str) -> bool:
        """Whether messages of ``source_system`` are confirmed at all (those that are not get no confirmation row)."""
        return True

    def confirmed_systems(self) -> frozenset[str] | None:
        """The finite set of confirmed source systems, or ``None`` when every system is confirmed.

        A callback whose :meth:`confirms` can say ``False`` should list its systems here, so that
        :meth:`ConfirmationService.sweep_missing` filters in SQL instead of scanning messages it will not confirm.
        """
        return None

    async def aclose(self) -> None:
        """Release connections held by the callback."""


class DefaultConfirmationCallback(ConfirmationCallback):
    """Confirms by logging the outcome (the default when no external system is configured): not :attr:`durable`, a
    log line needs no row, lease or retry.

    The line is at DEBUG by default: at INFO the transition log's line of the final state already says the outcome
    once per message (``openroute.runtime.logs.TransitionLog``); give ``level=logging.INFO`` to have both.
    """

    def __init__(self, logger: logging.Logger | None = None, level: int = logging.DEBUG) -> None:
        self._log = logger or log
        self._level = level

    @property
    def durable(self) -> bool:
        """``False``: a log line cannot fail and needs no retry (no confirmation row is kept)."""
        return False

    async def confirm(self, request: ConfirmationRequest) -> None:
        """Log the outcome of the message; never fails."""
        if not self._log.isEnabledFor(self._level):
            return
        codes = ",".join(e.code for e in request.business_errors)
        self._log.log(
            self._level,
            "confirmation: message %s (correlation %s) from %s ended %s%s%s",
            request.message_id,
            request.correlation_id,
            request.source_system,
            request.state,
            f" error {request.error_code}: {request.error_text}" if request.error_code or request.error_text else "",
            f" business errors [{codes}]" if codes else "",
        )


class ExternalSystemConfirmation(abc.ABC):
    """Confirmation to one external source system (SOAP, HTTP JSON, or your own)."""

    source_system: str

    def __init__(self, source_system: str) -> None:
        if not isinstance(source_system, str) or not source_system:
            raise InvalidConfirmationError(f"source_system must be a non-empty string, got {source_system!r}")
        self.source_system = source_system

    @abc.abstractmethod
    async def confirm(self, request: ConfirmationRequest) -> None:
        """Deliver one confirmation to the external system; raise if it did not arrive."""

    async def aclose(self) -> None:
        """Release connections held by this confirmation."""


class DelegateConfirmationCallback(ConfirmationCallback):
    """Picks the :class:`ExternalSystemConfirmation` registered for the request's source system.

    Source systems without a registered confirmation are not confirmed: :meth:`confirms` is ``False`` for them, so
    the :class:`~confirmation.ConfirmationService` never creates a confirmation for their messages. The registered
    ones are :attr:`durable` (a remote call can fail): their messages get rows.
    """

    def __init__(self, confirmations: Iterable[ExternalSystemConfirmation] = ()) -> None:
        self._by_system: dict[str, ExternalSystemConfirmation] = {}
        for confirmation in confirmations:
            self.register(confirmation)

    def register(self, confirmation: ExternalSystemConfirmation) -> None:
        """Add the confirmation of one source system; a second one for the same system is an error."""
        if not isinstance(confirmation, ExternalSystemConfirmation):
            raise InvalidConfirmationError(f"expected an ExternalSystemConfirmation, got {confirmation!r}")
        if confirmation.source_system in self._by_system:
            raise InvalidConfirmationError(
                f"source system {confirmation.source_system!r} already has a confirmation registered"
            )
        self._by_system[confirmation.source_system] = confirmation

    def confirms(self, source_system: str) -> bool:
        """Whether a confirmation is registered for ``source_system``."""
        return source_system in self._by_system

    def confirmed_systems(self) -> frozenset[str]:
        """The registered source systems."""
        return frozenset(self._by_system)

    async def confirm(self, request: ConfirmationRequest) -> None:
        """Send through the system's confirmation; a system without one is skipped (logged at debug level)."""
        confirmation = self._by_system.get(request.source_system)
        if confirmation is None:
            log.debug("no confirmation registered for source system %s, message %s not confirmed",
                      request.source_system, request.message_id)
            return
        await confirmation.confirm(request)

    async def aclose(self) -> None:
        """Close every registered confirmation."""
        for confirmation in self._by_system.values():
            await confirmation.aclose()
