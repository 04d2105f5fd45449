"""``openroute demo``: messages going through every state on a temporary SQLite store."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from openroute.commands import EXIT_APPLICATION

EXAMPLE = """example:
  openroute demo        prints each message's way through the states, then the admin API's counts
"""


def add_parser(subparsers: Any) -> None:
    """Add ``openroute demo`` to the command line."""
    subparsers.add_parser("demo", help="show messages going through every state on a temporary SQLite store",
                          description=__doc__, epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)


def run(args: argparse.Namespace) -> int:
    """Run the reference application's demo; 0 when every state was shown."""
    try:  # the demo belongs to the reference app, loaded by name like `run` loads its routes
        demo = importlib.import_module("openroute_reference.demo")
    except ImportError as error:
        print(f"openroute demo: the reference application is not installed: {error}", file=sys.stderr)
        return EXIT_APPLICATION
    return int(demo.main())
