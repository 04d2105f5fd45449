"""The messaging layer's one drain loop (internal): signals that re-enter (``request`` from inside ``on_next``)
only flag another round for the loop already running, so the stack stays bounded (Reactive Streams rule 3.3)."""

from __future__ import annotations


class DrainLoop:
    """Mixin: :meth:`_drain` runs :meth:`_drain_once` until no re-entrant call asked for another round."""

    _draining = False
    _missed = False

    def _drain(self) -> None:
        if self._draining:
            self._missed = True
            return
        self._draining = True
        try:
            while True:
                self._missed = False
                self._drain_once()
                if not self._missed:
                    break
        finally:
            self._draining = False

    def _drain_once(self) -> None:
        """Deliver what can be delivered now."""
        raise NotImplementedError
