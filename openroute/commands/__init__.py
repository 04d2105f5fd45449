"""The subcommands of the ``openroute`` command line, one module each (``add_parser(subparsers)`` and
``run(args) -> exit code``); :mod:`openroute.cli` lists them.

Exit codes shared by the commands: 0 done, 1 failed while running, 2 bad command line or configuration,
3 the application cannot be loaded (import error, DeploymentError), 4 the database cannot be reached,
5 the database schema is not at this version's migration, 6 the port is taken, 7 a service of the node cannot start
(a channel's broker unreachable or refusing the login).
"""

from __future__ import annotations

import argparse

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIGURATION = 2
EXIT_APPLICATION = 3
EXIT_DATABASE = 4
EXIT_SCHEMA = 5
EXIT_PORT = 6
EXIT_SERVICES = 7


def resolve_database_url(args: argparse.Namespace) -> str:
    """The store's URL as every command resolves it: ``--database-url`` over ``OPENROUTE_DATABASE_URL`` (and the
    other ``OPENROUTE_DATABASE_...`` variables) over the ``--config`` TOML file over ``sqlite:///openroute.db``, with
    the password of ``database_password_file`` / ``_env`` put in (:func:`openroute.config.load_database_config`:
    the file's other sections are not read, so an operator needs none of the server's other secrets).

    Raises ConfigurationError for a configuration file that cannot be read, a bad database key or password source.
    """
    from openroute.config import load_database_config

    config = load_database_config(getattr(args, "config", None),
                                  {"database_url": getattr(args, "database_url", None)})
    return config.resolved_database_url()
