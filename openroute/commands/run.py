"""``openroute run``: serve an application's routes (HTTP/SOAP, admin API, /metrics, /health) with uvicorn.

Start-up checks each end the command with one line on stderr and its own exit code (see
:mod:`openroute.commands`): the configuration, the application, the database, its schema, the port.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib.util
import logging
import socket
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from openroute.commands import (
    EXIT_APPLICATION,
    EXIT_CONFIGURATION,
    EXIT_DATABASE,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PORT,
    EXIT_SCHEMA,
    EXIT_SERVICES,
)
from openroute.commands.db import _first_line, _safe
from openroute.runtime import collector

if TYPE_CHECKING:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.types import ASGIApp

    from openroute.config import ServerConfig
    from openroute.dsl import Application
    from openroute.persistence import MessageStore

log = logging.getLogger("openroute.run")

EXAMPLE = """examples:
  openroute run                                      the reference application on http://127.0.0.1:8080
  openroute run --routes myapp:app --port 9000       ./myapp.py's `app` (an openroute.Application)
  openroute run --config openroute.toml --migrate    everything from one file; bring the schema up to date
  OPENROUTE_DATABASE_URL=postgresql+psycopg://openroute@db/openroute openroute run --log-format json

Precedence: command-line options over OPENROUTE_... environment variables over the --config file.
Exit codes: 2 configuration, 3 application, 4 database unreachable, 5 schema not migrated, 6 port in use,
7 a service cannot start (a broker unreachable or refusing the login).
"""


def add_parser(subparsers: Any) -> None:
    """Add ``openroute run`` and its options to the command line."""
    run = subparsers.add_parser("run", help="serve the routes of an application (default: the reference app)",
                                description=__doc__, epilog=EXAMPLE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--config", default=None, metavar="FILE", help="TOML file with the whole configuration")
    run.add_argument("--routes", default=None, metavar="MODULE:ATTR",
                     help="the application to serve (default: the reference app, openroute_reference:registry)")
    run.add_argument("--host", default=None, help="interface to listen on (default 127.0.0.1)")
    run.add_argument("--port", type=int, default=None, help="port to listen on (default 8080)")
    run.add_argument("--database-url", default=None, help="SQLAlchemy URL (default: sqlite:///openroute.db)")
    run.add_argument("--migrate", action="store_true", default=None,
                     help="bring the database schema to the newest migration before serving")
    run.add_argument("--log-level", default=None, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                     type=str.upper, help="default INFO")
    run.add_argument("--log-format", default=None, choices=["text", "json"], help="default text")
    run.add_argument("--access-log", action="store_true", default=None,
                     help="log a line per HTTP request (uvicorn's access log; default off, on at DEBUG)")
    run.add_argument("--auth-config", default=None, metavar="FILE",
                     help="JSON file with sourceSystems, admins and confirmations (older form of --config)")


class StartupError(Exception):
    """A start-up check failed: ``exit_code`` and a one-line (or, for a DeploymentError, listed) reason."""

    def __init__(self, exit_code: int, reason: str) -> None:
        super().__init__(reason)
        self.exit_code = exit_code


def run(args: argparse.Namespace) -> int:
    """Check everything, bind the port, then serve until SIGINT/SIGTERM; returns the exit code."""
    try:
        server, sock = prepare(args)
    except StartupError as error:
        from openroute.persistence import mask_secrets

        print(f"openroute run: {mask_secrets(str(error))}", file=sys.stderr)
        return error.exit_code
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it has already handled by shutting down
        pass
    except SystemExit:  # uvicorn's own exit (code 3) when the app's start failed: told below with our code
        pass
    finally:
        sock.close()
    failed = getattr(server.config.app, "failure", None)
    if failed is not None:
        print(f"openroute run: {failed}", file=sys.stderr)
        return EXIT_SERVICES
    return EXIT_OK if server.started else EXIT_FAILED


def prepare(args: argparse.Namespace) -> tuple[uvicorn.Server, socket.socket]:
    """Every start-up check in order; returns the uvicorn server and its bound listening socket.

    Raises StartupError with the exit code of the first check that fails."""
    from openroute.config import load_config
    from openroute.definitions.errors import ConfigurationError, DeploymentError
    from openroute.runtime.logs import configure_logging

    overrides = {"routes": args.routes, "host": args.host, "port": args.port, "database_url": args.database_url,
                 "migrate": args.migrate,
                 "log": {"level": args.log_level, "format": args.log_format, "access": args.access_log}}
    try:
        config = load_config(args.config, overrides, auth_config=args.auth_config)
        url = config.resolved_database_url()
        tracing_on = config.tracing.start()
    except ConfigurationError as error:
        raise StartupError(EXIT_CONFIGURATION, str(error)) from None
    configure_logging(config.log.level, config.log.format)
    if tracing_on:
        log.info("tracing on: spans of service %s exported by OTLP to %s", config.tracing.service_name,
                 config.tracing.endpoint or "the OTEL_EXPORTER_OTLP_* endpoint")

    sock = _bind(config.host, config.port)  # first: a taken port stops the start before the database is touched
    store = None
    try:
        loaded = _load_application(config.routes)
        store = _open_store(url, migrate=config.migrate)
        return _server(config, loaded, store, sock), sock
    except (ConfigurationError, DeploymentError) as error:  # the engine's own check of the routes
        problems = getattr(error, "problems", None) or [str(error)]
        failure = StartupError(EXIT_APPLICATION, "; ".join(problems))
    except StartupError as error:
        failure = error
    sock.close()
    if store is not None:
        store.dispose()
    raise failure


def _load_application(routes: str | None) -> Application:
    from openroute.definitions.errors import ConfigurationError, DeploymentError
    from openroute.loading import DEFAULT_ROUTES, load_application

    try:
        if routes is None and importlib.util.find_spec(DEFAULT_ROUTES.partition(":")[0]) is None:
            raise ConfigurationError("no reference application 'openroute_reference' here: "
                                     "pass --routes module:attribute")
        return load_application(routes or DEFAULT_ROUTES)
    except DeploymentError as error:
        problems = getattr(error, "problems", None) or [str(error)]
        count = f"{len(problems)} deployment problem{'s' if len(problems) > 1 else ''}"
        raise StartupError(EXIT_APPLICATION, f"{routes or DEFAULT_ROUTES}: {count}: {'; '.join(problems)}") from None
    except ConfigurationError as error:
        raise StartupError(EXIT_APPLICATION, str(error)) from None


def _open_store(url: str, *, migrate: bool) -> MessageStore:
    """The store at this version's schema: an empty database gets it, an older one needs ``--migrate``."""
    import sqlalchemy as sa

    from openroute.persistence import MessageStore

    shown = _safe(url)
    try:
        store = MessageStore(url)
    except Exception as error:  # a malformed URL or a missing driver
        raise StartupError(EXIT_CONFIGURATION, f"database_url {shown}: {_first_line(error)}") from None
    try:
        current = store.current_revision()
        empty = current is None and not sa.inspect(store.engine).get_table_names()
    except Exception as error:
        store.dispose()
        raise StartupError(EXIT_DATABASE, f"cannot reach the database {shown}: {_first_line(error)}") from None
    head = MessageStore.head_revision()
    if current == head:
        return store
    if migrate or empty:
        try:
            store.upgrade()
        except Exception as error:
            store.dispose()
            raise StartupError(EXIT_SCHEMA, f"migrating {shown} to {head} failed: {_first_line(error)}") from None
        log.info("database %s: schema %s to revision %s", shown,
                 "created" if empty else f"migrated from revision {current}", head)
        return store
    store.dispose()
    if current is None:
        found = "has tables but no openroute schema revision"
    else:
        found = f"is at schema revision {current}, this openroute needs {head}"
    raise StartupError(EXIT_SCHEMA, f"database {shown} {found}: run `openroute db upgrade --database-url "
                                    f"{shown}` or start with `openroute run --migrate`")


def _server(config: ServerConfig, loaded: Application, store: MessageStore, sock: socket.socket) -> uvicorn.Server:
    import uvicorn

    from openroute.node import Node
    from openroute.wire.header_limits import limit_headers
    from openroute.wire.proxy_headers import ProxyHeaders
    from openroute.wire.request_deadline import request_deadline_protocol

    node = Node.from_config(config, loaded, store)
    app, channels = node.app, node.channels
    host, port = sock.getsockname()[:2]
    spec = config.routes or "openroute_reference:registry"
    started = (f"serving {len(loaded.routes)} routes of {spec} on http://{host}:{port} "
               f"(SOAP /soap/<service>, JSON /api/<service>/<operation>, /admin, /metrics, /health)"
               + (f"; channels {', '.join(channels.channels)}" if channels is not None else ""))
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(served: Starlette) -> AsyncIterator[None]:
        async with inner(served):
            for note in loaded.notes:
                log.info("%s", note)
            log.info("%s", started)  # only once the engine runs and the port is ours
            # start-up's objects out of the collector's reach, a wider young generation (openroute.runtime.collector)
            collector.tune_for_serving()
            yield
        if config.tracing.enabled:  # after the engine stopped: its last spans are exported too
            import asyncio

            from openroute.runtime import tracing

            await asyncio.to_thread(tracing.disable)

    app.router.lifespan_context = lifespan
    # log_config None: uvicorn's records go through the handler of configure_logging, in the same format;
    # http: uvicorn's protocol with a deadline for each request to arrive whole (slow clients are cut off);
    # access_log off: uvicorn then does not even build the line (a quarter of a /health request's CPU)
    # and a limit on the headers of each request (431 before the app sees it);
    # proxy headers: the client's address is the socket's unless [server] forwarded_allow_ips names the proxy
    # (ours read Forwarded as well as X-Forwarded-For; uvicorn's are off)
    http = limit_headers(request_deadline_protocol(config.inbound.request_deadline.total_seconds()),
                         config.inbound.header_limits())
    access_log = config.log.access or config.log.level == "DEBUG"
    proxies = list(config.server.forwarded_allow_ips)
    served: ASGIApp = ProxyHeaders(app, proxies) if proxies else app
    return uvicorn.Server(uvicorn.Config(StartFailureInOneLine(served), log_config=None,
                                         log_level=config.log.level.lower(), http=http, access_log=access_log,
                                         proxy_headers=False))


class StartFailureInOneLine:
    """The ASGI app whose start-up failure (a broker refusing the login, say) ends ``openroute run`` with one line and
    exit code 7: Starlette hands uvicorn the whole traceback to log, and uvicorn adds a line of its own.

    ``failure`` holds the line once the start failed; :func:`run` prints it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.failure: str | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Pass every scope on; a lifespan start that fails is reported as one line (``failure``)."""
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def told(message: Any) -> None:
            if message["type"] == "lifespan.startup.failed":
                error = sys.exc_info()[1]  # Starlette sends this from its handler of the start's exception
                self.failure = _first_line(error) if error is not None else "the node's services did not start"
                logging.getLogger("uvicorn.error").addFilter(_quiet_start_failure)
                message = {**message, "message": ""}
            await send(message)

        await self.app(scope, receive, told)


def _quiet_start_failure(record: logging.LogRecord) -> bool:
    """Drops uvicorn's "Application startup failed. Exiting.": :func:`run` prints the reason instead."""
    return record.getMessage() != "Application startup failed. Exiting."


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything says "serving"."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise StartupError(EXIT_CONFIGURATION, f"host {host!r}: {error.strerror}") from None
    family, kind, proto = infos[0][:3]
    # the protocol named (IPPROTO_TCP, as getaddrinfo gives it): asyncio sets TCP_NODELAY only on connections of
    # such a socket; with proto 0 a response written as headers then body waited ~40 ms for the client's
    # delayed ACK on every keep-alive request
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(infos[0][4])
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise StartupError(EXIT_PORT, f"port {port} on {host} is in use: stop the other server or pass "
                                          "--port") from None
        raise StartupError(EXIT_PORT, f"cannot listen on {host}:{port}: {error.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
