"""The ``openroute`` command line: a registry of subcommand modules.

``openroute demo``        show messages going through every state on a temporary SQLite file
``openroute run``         serve an application's routes (HTTP/SOAP, admin API, /metrics, /health)
``openroute db upgrade``  bring the database schema to the newest migration
``openroute db mask-secrets``  mask the secrets in the stored texts again (after adding a secret name)
``openroute messages``    list, show, restart and cancel messages (store or a server's admin API)
``openroute spark``       bulk reprocessing, audits and archiving of the store on Spark

Each subcommand lives in its own module with ``add_parser(subparsers)`` and ``run(args) -> int``; add one line to
``COMMANDS`` for a new one.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

#: the modules of the subcommands, in the order ``openroute --help`` lists them
COMMANDS = [
    "openroute.commands.demo",
    "openroute.commands.run",
    "openroute.commands.db",
    "openroute.console.cli",
    "openroute.spark.cli",
]

EXAMPLE = """examples:
  openroute demo                         see a message go through every state (temporary SQLite file)
  openroute run --routes myapp:app       serve ./myapp.py's application on http://127.0.0.1:8080
  openroute run --help                   every option of a command, with examples
"""


def openroute_version() -> str:
    """The installed distribution's version."""
    try:
        return version("openroute")
    except PackageNotFoundError:  # running from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The ``openroute`` command line: its subcommands (run, demo, db, messages, spark) and their options."""
    parser = argparse.ArgumentParser(prog="openroute", description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"openroute {openroute_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    handlers = {}
    for name in COMMANDS:
        module = importlib.import_module(name)
        before = set(subparsers.choices)
        module.add_parser(subparsers)
        for command in set(subparsers.choices) - before:
            handlers[command] = module.run
            _examples_from_docstring(subparsers.choices[command], module.__doc__ or "")
    parser.set_defaults(_handlers=handlers)
    return parser


def _examples_from_docstring(parser: argparse.ArgumentParser, doc: str) -> None:
    """A command (and its subcommands) without an epilog shows its module's docstring, examples included."""
    if parser.epilog is None and "openroute " in doc:
        parser.epilog = doc
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _examples_from_docstring(sub, doc)


#: the commands whose store URL is resolved here, before they run (``run`` and ``db`` resolve it themselves, with
#: the rest of the server's configuration, through the same :func:`openroute.commands.resolve_database_url`)
RESOLVED_HERE = ("messages", "spark")


def resolve_settings(args: argparse.Namespace) -> int | None:
    """Put the resolved store URL into ``args.database_url`` for the commands of :data:`RESOLVED_HERE`; returns
    the exit code of a bad configuration (after printing it), else None."""
    if args.command not in RESOLVED_HERE or getattr(args, "url", None):  # --url: a server's admin API, no store
        return None
    from openroute.commands import EXIT_CONFIGURATION, resolve_database_url
    from openroute.definitions.errors import ConfigurationError

    try:
        args.database_url = resolve_database_url(args)
    except ConfigurationError as error:
        print(f"openroute {args.command}: {error}", file=sys.stderr)
        return EXIT_CONFIGURATION
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` names (default: ``sys.argv[1:]``) once its settings are resolved; the exit code."""
    args = build_parser().parse_args(argv)
    failed = resolve_settings(args)
    if failed is not None:
        return failed
    try:
        code = int(args._handlers[args.command](args))
        sys.stdout.flush()  # here, not at exit: a reader that left is seen below
    except BrokenPipeError:
        # the reader of the output left (`openroute messages show 42 | head`): finish quietly, with no traceback
        # and no second error when the interpreter flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
