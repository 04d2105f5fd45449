"""The subcommands of the ``openroute`` command line, one module each (``add_parser(subparsers)`` and
``run(args) -> exit code``); :mod:`openroute.cli` lists them.

Exit codes shared by the commands: 0 done, 1 failed while running, 2 bad command line or configuration,
3 the application cannot be loaded (import error, DeploymentError), 4 the database cannot be reached,
5 the database schema is not at this version's migration, 6 the port is taken.
"""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIGURATION = 2
EXIT_APPLICATION = 3
EXIT_DATABASE = 4
EXIT_SCHEMA = 5
EXIT_PORT = 6
