"""Deprecated name of :mod:`openroute.streams.runner` (one meaning per word: "engine" is the message engine).

Importing it warns; it will be removed once nothing imports it.
"""

from __future__ import annotations

import warnings

from .runner import (  # noqa: F401  (re-exported under the old name)
    AssembledPublisher,
    CompositeProcessor,
    build_processor,
    build_publisher,
    build_source,
    build_subscriber,
    build_terminal,
    to_publisher,
)

warnings.warn(
    "openroute.streams.engine is deprecated; use openroute.streams.runner",
    DeprecationWarning,
    stacklevel=2,
)
