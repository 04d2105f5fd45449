"""The web console of openroute (``/console``) and the ``openroute messages`` command line.

``from openroute.console import Console``
"""

from openroute.console.app import Console, CsrfError

__all__ = ["Console", "CsrfError"]
