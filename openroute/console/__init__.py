"""The web console of openroute (``/console``) and the ``openroute messages`` command line.

``from openroute.console import Console``
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openroute.console.app import Console, CsrfError

__all__ = ["Console", "CsrfError"]


def __getattr__(name: str) -> Any:
    # on first use: every ``openroute`` command imports console.cli to build its parser, and the app pulls in the
    # admin API, pandas and the outbound clients (about 1.5 s of CPU before any command could start)
    if name in __all__:
        from openroute.console import app

        return getattr(app, name)
    raise AttributeError(f"module 'openroute.console' has no attribute {name!r}")
