"""``openroute messages list|show|restart|cancel|mark-done|call-again``: the operator's command line.

With the store's URL (``--database-url`` over ``OPENROUTE_DATABASE_URL`` over the ``--config`` file over the SQLite
file ``openroute.db``, resolved by :mod:`openroute.cli` as for every command) it reads the store and acts
through an :class:`~openroute.engine.Engine` that is not started (a restarted message is picked up by the next
repoll of a running node); with ``--url`` it talks to a running server's admin API (``--user``, password from
``OPENROUTE_ADMIN_PASSWORD`` or a prompt). Output: aligned tables on a terminal, tab-separated lines in a pipe,
JSON with ``--json``; for example::

    openroute messages list --state FAILED --service crm
    openroute messages show 42 --json
    openroute messages restart 42 43
    openroute messages restart --state FAILED --operation setCustomer --dry-run
    openroute messages list --error-code HLR_DOWN --error-code TIMEOUT --payload-text 420777
    openroute messages restart --error-code HLR_DOWN --received-from 2024-03-01T08:00:00+00:00
    openroute messages cancel --state PARTLY_FAILED --source-system ERP --yes
    openroute messages mark-done 44      # its calls in doubt did happen: recorded OK, message restarted
    openroute messages call-again 45     # they did not: restarted, made again with the same idempotency key
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, TextIO, cast

from openroute.runtime.bulk import spark_suggestion

#: (option, admin search parameter)
FILTERS = (
    ("--service", "service"),
    ("--operation", "operation"),
    ("--source-system", "source_system"),
    ("--correlation-id", "correlation_id"),
    ("--object-id", "object_id"),
    ("--process-id", "process_id"),
    ("--entity-type", "entity_type"),
    ("--received-from", "received_from"),
    ("--received-to", "received_to"),
    ("--error-text", "error_text"),
    ("--payload-text", "payload_text"),
)
_FILTER_HELP = {
    "--error-text": "text inside the current error text (any case; SQLite scans, PostgreSQL uses an index)",
    "--payload-text": "text inside the payload (any case; SQLite scans, PostgreSQL uses an index)",
}
#: the list's columns: the admin API's item keys, and ``nextAttempt`` (its due time, or what it waits for)
LIST_COLUMNS = ("id", "state", "service", "operation", "sourceSystem", "correlationId", "failedCount",
                "lastErrorCode", "receivedAt", "nextAttempt")
#: messages acted on by one bulk command at most
BULK_LIMIT = 100_000


class CliError(Exception):
    """A problem the command reports on stderr with exit code 2 (bad input, nothing done)."""


def _too_many() -> CliError:
    return CliError(f"more than {BULK_LIMIT} messages match: narrow the filters, or restart them in bulk with "
                    "openroute spark reprocess (docs/spark.md)")


def _message_id(raw: str) -> int:
    """A message id argument: a usage error (exit 2) unless in 1..2**63-1, as the admin API checks it."""
    from openroute.queries.filters import InvalidQueryError, parse_message_id

    try:
        return parse_message_id(raw)
    except InvalidQueryError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_parser(subparsers: Any) -> None:
    """Register ``messages`` and its subcommands on the ``openroute`` parser."""
    messages = subparsers.add_parser("messages", help="search, show, restart and cancel messages")
    commands = messages.add_subparsers(dest="messages_command", required=True)

    def common(parser: argparse.ArgumentParser) -> None:
        where = parser.add_mutually_exclusive_group()
        where.add_argument("--database-url", default=None,
                           help="SQLAlchemy URL of the store (default: $OPENROUTE_DATABASE_URL, else the --config "
                                "file's database_url, else sqlite:///openroute.db)")
        where.add_argument("--url", default=None, help="base URL of a running server (its admin API)")
        parser.add_argument("--config", default=None, metavar="FILE",
                            help="the server's TOML configuration (its database_url), under --database-url and "
                                 "OPENROUTE_DATABASE_URL")
        parser.add_argument("--user", default=os.environ.get("OPENROUTE_ADMIN_USER"),
                            help="admin API user with --url (password: OPENROUTE_ADMIN_PASSWORD or a prompt)")
        parser.add_argument("--json", action="store_true", help="print JSON")

    def filters(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--state", action="append", default=[], help="a state (repeat for several)")
        parser.add_argument("--error-code", action="append", default=[],
                            help="the current error code (repeat, or comma-separate, for several)")
        for option, _ in FILTERS:
            parser.add_argument(option, default=None, help=_FILTER_HELP.get(option))

    listing = commands.add_parser("list", help="messages matching the filters, newest first")
    common(listing)
    filters(listing)
    listing.add_argument("--limit", type=int, default=50, help="at most this many (1-500, default 50)")
    listing.add_argument("--cursor", default=None, help="continue after the page that printed this cursor")

    show = commands.add_parser("show", help="one message with its history, calls, children and confirmation")
    common(show)
    show.add_argument("id", type=_message_id)

    for name, what in (("restart", "restart FAILED / CANCEL messages"), ("cancel", "cancel messages not final"),
                       ("mark-done", "calls in doubt did happen: record them OK and restart the messages"),
                       ("call-again", "calls in doubt did not happen: restart the messages, make the calls again")):
        action = commands.add_parser(name, help=f"{what}: the given ids, or every message matching the filters")
        common(action)
        filters(action)
        action.add_argument("ids", type=_message_id, nargs="*", help="message ids (or give filters instead)")
        action.add_argument("--dry-run", action="store_true", help="only count the messages the filters match")
        action.add_argument("--yes", action="store_true", help="do not ask for confirmation (scripts)")


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None,
        stdin: TextIO | None = None) -> int:
    """Run ``openroute messages ...``; returns the exit code (0 done, 1 some action refused, 2 bad input)."""
    out = out or sys.stdout
    err = err or sys.stderr
    stdin = stdin or sys.stdin
    try:
        backend = _backend(args, stdin)
        try:
            return _dispatch(args, backend, out, err, stdin)
        finally:
            backend.close()
    except CliError as error:
        from openroute.persistence import mask_secrets

        print(f"openroute messages: {mask_secrets(str(error))}", file=err)
        return 2


def _dispatch(args: argparse.Namespace, backend: Any, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    command = args.messages_command
    if command == "list":
        items, cursor, total, estimated = backend.search(_filter_params(args), args.cursor, args.limit)
        if args.json:
            body: dict[str, Any] = {"total": total, "countEstimated": estimated, "items": items}
            if cursor is not None:
                body["nextCursor"] = cursor
            print(json.dumps(body, indent=2), file=out)
        else:
            from openroute.console._search import next_attempt

            _table([{**item, "nextAttempt": next_attempt(item["state"], item.get("nextAttemptAt"), item.get("parkedOn"),
                                                         item.get("lastErrorCode"))} for item in items],
                   LIST_COLUMNS, out)
            more = f"; next page: --cursor {cursor}" if cursor is not None else ""
            print(f"{len(items)} of {total}{'+' if estimated else ''} matching{more}", file=err)
        return 0
    if command == "show":
        detail = backend.detail(args.id)
        if args.json:
            print(json.dumps(detail, indent=2), file=out)
        else:
            _show(detail, out)
        return 0
    return _act(args, backend, out, err, stdin)


def _act(args: argparse.Namespace, backend: Any, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    action = args.messages_command
    params = _filter_params(args)
    if args.ids and params:
        raise CliError("give message ids or filters, not both")
    if not args.ids and not params:
        raise CliError(f"give message ids or filters (e.g. --state FAILED --service crm) to {action}")
    ids = list(dict.fromkeys(args.ids)) if args.ids else _matching(action, params, backend, err)
    if args.dry_run:
        print(json.dumps({"action": action, "matching": len(ids)}) if args.json
              else f"{action}: {len(ids)} messages match (dry run, nothing done)", file=out)
        return 0
    if not ids:
        print(f"{action}: no message matches", file=err)
        return 0
    if not args.yes:
        if not stdin.isatty():
            raise CliError(f"{action} of {len(ids)} messages needs --yes when not run on a terminal")
        print(f"{action.capitalize()} {len(ids)} messages? [y/N] ", end="", file=err, flush=True)
        if stdin.readline().strip().lower() not in ("y", "yes"):
            print("nothing done", file=err)
            return 1
    results = backend.act(action, ids)
    refused = [r for r in results if not r["ok"]]
    if args.json:
        print(json.dumps({"action": action, "done": len(results) - len(refused), "results": results}, indent=2),
              file=out)
    else:
        for result in results:
            print(f"{result['id']}\t{'done' if result['ok'] else 'refused'}\t{result['detail']}", file=out)
        print(f"{action}: {len(results) - len(refused)} done, {len(refused)} refused", file=err)
    return 1 if refused else 0


def _matching(action: str, params: dict[str, Any], backend: Any, err: TextIO) -> list[int]:
    """The ids the filters select; above the measured crossover (openroute/runtime/bulk.py) a line on ``err`` says a
    Spark job does it quicker."""
    if action in ("restart", "mark-done", "call-again") and not params.get("state"):
        params["state"] = ["FAILED"]  # only FAILED and CANCEL can be restarted; FAILED is what one means
    ids = list(backend.matching_ids(params))
    hint = spark_suggestion(len(ids))
    if hint is not None:
        print(hint, file=err)
    return ids


def _filter_params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if getattr(args, "state", None):
        params["state"] = list(args.state)
    if getattr(args, "error_code", None):
        params["error_code"] = list(args.error_code)
    for option, name in FILTERS:
        value = getattr(args, option.lstrip("-").replace("-", "_"), None)
        if value is not None:
            params[name] = value
    return params


# -- output -----------------------------------------------------------------------------------------
def _cell(value: Any) -> str:
    if value is None:
        return ""
    text = str(value)
    if "\n" in text or "\t" in text:  # one cell, one line (an error's text may span several)
        text = " ".join(text.split())
    return text.replace("T", " ")[:23] if isinstance(value, str) and len(text) > 19 and text[10:11] == "T" else text


def _table(items: list[dict[str, Any]], columns: Sequence[str], out: TextIO) -> None:
    rows = [[_cell(item.get(column)) for column in columns] for item in items]
    if not out.isatty():
        for row in rows:
            print("\t".join(row), file=out)
        return
    widths = [max([len(column)] + [len(row[i]) for row in rows]) for i, column in enumerate(columns)]
    print("  ".join(column.ljust(width) for column, width in zip(columns, widths, strict=True)).rstrip(), file=out)
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(), file=out)


def _show(detail: dict[str, Any], out: TextIO) -> None:
    from openroute.console.app import pretty_payload

    keys = ("id", "state", "service", "operation", "sourceSystem", "correlationId", "processId", "entityType",
            "objectId", "funnelValue", "failedCount", "attempts", "receivedAt", "startedAt", "lastUpdateAt",
            "nextAttemptAt", "nodeId", "parentId", "lastErrorCode", "lastErrorText")
    width = max(len(k) for k in keys)
    for key in keys:
        print(f"{key.ljust(width)}  {_cell(detail.get(key))}", file=out)
    for error in detail.get("businessErrors") or []:
        print(f"{'businessError'.ljust(width)}  {error.get('code')}: {error.get('text')}", file=out)
    if detail.get("confirmation"):
        c = detail["confirmation"]
        print(f"{'confirmation'.ljust(width)}  {c['status']} ({c['outcomeState']}, {c['attempts']} attempts)"
              f"{' ' + c['lastError'] if c.get('lastError') else ''}", file=out)
    if detail.get("callsInDoubt"):
        print(f"{'callsInDoubt'.ljust(width)}  {', '.join(detail['callsInDoubt'])} (started, no outcome recorded; "
              f"resolve with: openroute messages mark-done|call-again {detail.get('id')})", file=out)
    sections = (
        ("state path", detail.get("transitions") or [], ("at", "fromState", "toState", "attempt", "errorCode",
                                                         "nodeId", "cause", "errorText")),
        ("external calls", detail.get("externalCalls") or [], ("callKey", "status", "attempts", "refused",
                                                               "idempotencyKey", "nodeId", "result", "lastError")),
        ("children", detail.get("children") or [], ("id", "state", "service", "operation", "lastErrorCode")),
    )
    for title, items, columns in sections:
        if items:
            print(f"\n{title}:", file=out)
            _table([{k: json.dumps(v) if isinstance(v, dict | list) else v for k, v in i.items()} for i in items],
                   columns, out)
    traces = [t for t in detail.get("transitions") or [] if t.get("errorTrace")]
    if traces:  # the traceback of the newest unexpected error
        last = traces[-1]
        print(f"\ntraceback ({last['fromState']} -> {last['toState']}, attempt {last['attempt']}):", file=out)
        print(last["errorTrace"], file=out)
    print(f"\npayload ({detail.get('contentType')}):", file=out)
    print(pretty_payload(detail.get("payload") or "", detail.get("contentType") or ""), file=out)


# -- backends ---------------------------------------------------------------------------------------
def _backend(args: argparse.Namespace, stdin: TextIO) -> Any:
    if args.url:
        if not args.user:
            raise CliError("--url needs --user (or OPENROUTE_ADMIN_USER)")
        password = os.environ.get("OPENROUTE_ADMIN_PASSWORD")
        if password is None:
            if not stdin.isatty():
                raise CliError("set OPENROUTE_ADMIN_PASSWORD (no terminal to ask for the password)")
            password = getpass.getpass(f"password of {args.user}: ")
        return ServerBackend(args.url, args.user, password)
    if args.database_url is None:  # the command line resolves it before the command runs (openroute.cli)
        raise CliError("the store's URL is not resolved: run openroute messages (openroute.cli.main)")
    return StoreBackend(args.database_url)


class StoreBackend:
    """Reads the store directly; acts through a (not started) engine, cause ``cli:<os user>``."""

    def __init__(self, url: str) -> None:
        from openroute.persistence import MessageStore, mask_secrets, masked_url, sqlite_file

        shown = masked_url(url)
        file = sqlite_file(url)
        if file is not None and not file.is_file():  # opening it would create an empty store: say so instead
            raise CliError(f"{shown}: there is no store file {file.resolve()} (nothing created); give the store with "
                           "--database-url, --config or OPENROUTE_DATABASE_URL, or create it with openroute db upgrade")
        try:
            self.store = MessageStore(url)
            revision = self.store.current_revision()
        except Exception as error:  # a bad URL or driver: say which
            raise CliError(f"cannot open the store {shown}: {mask_secrets(str(error))}") from None
        if revision is None:
            self.store.dispose()
            raise CliError(f"{shown} has no openroute schema (run: openroute db upgrade --database-url ...)")
        import socket

        # who and from where, in the transition rows and the log line of each action
        self.cause = f"cli:{getpass.getuser()}@{socket.gethostname()}"[:255]

    def close(self) -> None:
        """Release the store's connections."""
        self.store.dispose()

    def _page(self, params: dict[str, Any], cursor: str | None, limit: int) -> Any:
        from openroute.console._search import search_page

        try:
            return search_page(self.store, {**params, "limit": str(limit), **({"cursor": cursor} if cursor else {})})
        except Exception as error:
            if type(error).__name__ == "InvalidQueryError":
                raise CliError(str(error)) from None
            raise

    def search(self, params: dict[str, Any], cursor: str | None, limit: int) -> tuple[list[dict[str, Any]],
                                                                                      str | None, int, bool]:
        """One page of the messages ``params`` filters: (summaries, next cursor, count, whether the count is capped)."""
        from openroute.queries.messages import summaries

        page = self._page(params, cursor, limit)
        return summaries(page.rows), page.next_cursor, page.total, page.total_estimated

    def matching_ids(self, params: dict[str, Any]) -> Iterator[int]:
        """The ids of every message ``params`` filters, page after page."""
        cursor, count = None, 0
        while True:
            page = self._page(params, cursor, 500)
            for row in page.rows:
                count += 1
                if count > BULK_LIMIT:
                    raise _too_many()
                yield int(row.id)
            cursor = page.next_cursor
            if cursor is None:
                return

    def detail(self, message_id: int) -> dict[str, Any]:
        """The admin API's view of one message; CliError when there is no such message."""
        from openroute.queries.messages import load_message_detail

        detail = load_message_detail(self.store, message_id)
        if detail is None:
            raise CliError(f"no message {message_id}")
        return detail

    def act(self, action: str, ids: list[int]) -> list[dict[str, Any]]:
        """Restart or cancel each of ``ids`` through an engine (not started); one result per id."""
        return asyncio.run(self._act(action, ids))

    async def _act(self, action: str, ids: list[int]) -> list[dict[str, Any]]:
        from openroute.definitions.errors import IllegalTransitionError, StaleMessageError
        from openroute.definitions.route import RouteRegistry
        from openroute.engine import Engine, EngineSettings
        from openroute.engine.in_doubt import resolve_in_doubt
        from openroute.runtime.logs import ensure_action_log, log_action

        ensure_action_log()

        engine = Engine(self.store, RouteRegistry(), EngineSettings(repoll_interval=None, db_threads=1,
                                                                    node_id=f"cli-{os.getpid()}"))
        results = []
        try:
            for message_id in ids:
                try:
                    before = await asyncio.to_thread(self.store.get, message_id)
                    if action == "restart":
                        updated = await engine.restart(message_id, self.cause)
                    elif action in ("mark-done", "call-again"):
                        resolved = await resolve_in_doubt(engine, message_id, cast(Any, action), self.cause)
                        updated = resolved.message
                    else:
                        updated = await engine.cancel(message_id, self.cause,
                                                      reason=f"cancelled by operator {getpass.getuser()} (CLI)")
                    log_action(f"{action}ed" if action == "restart" else "cancelled", message_id,
                               before.state.value if before is not None else "?", updated.state.value, self.cause)
                    results.append({"id": message_id, "ok": True, "detail": updated.state.value})
                except (LookupError, IllegalTransitionError, StaleMessageError) as error:
                    results.append({"id": message_id, "ok": False, "detail": str(error)})
        finally:
            await engine.stop()
        return results


class ServerBackend:
    """Talks to the admin API of a running server (HTTP Basic)."""

    def __init__(self, url: str, user: str, password: str) -> None:
        import httpx

        self.http = httpx.Client(base_url=url.rstrip("/"), auth=(user, password), timeout=30)

    def close(self) -> None:
        """Close the HTTP client."""
        self.http.close()

    def _get(self, path: str, params: Any = None) -> Any:
        import httpx

        try:
            response = self.http.get(path, params=params)
        except httpx.HTTPError as error:
            raise CliError(f"cannot reach {self.http.base_url}: {error}") from None
        return self._answer(response)

    @staticmethod
    def _answer(response: Any) -> Any:
        try:
            body = response.json()
        except ValueError:
            body = {"reason": response.text[:200]}
        if response.status_code >= 400:
            raise CliError(f"HTTP {response.status_code}: {body.get('reason', body)}")
        return body

    def search(self, params: dict[str, Any], cursor: str | None, limit: int) -> tuple[list[dict[str, Any]],
                                                                                      str | None, int, bool]:
        """One page of the admin API's search: (summaries, next cursor, count, whether the count is capped)."""
        query = {**params, "page_size": str(limit)}
        if cursor is not None:
            query["cursor"] = cursor
        body = self._get("/admin/messages", query)
        return body["items"], body.get("nextCursor"), body["total"], bool(body.get("countEstimated"))

    def matching_ids(self, params: dict[str, Any]) -> Iterator[int]:
        """The ids of every message the admin API's search returns for ``params``, page after page."""
        cursor, page, count = None, 1, 0
        while True:
            query = {**params, "page_size": "500"}
            if cursor is not None:
                query["cursor"] = cursor
            elif page > 1:
                query["page"] = str(page)  # a server without keyset pages
            body = self._get("/admin/messages", query)
            for item in body["items"]:
                count += 1
                if count > BULK_LIMIT:
                    raise _too_many()
                yield int(item["id"])
            cursor = body.get("nextCursor")
            if cursor is None and ("page" not in body or page * 500 >= body["total"]):
                return
            page += 1

    def detail(self, message_id: int) -> dict[str, Any]:
        """The admin API's view of one message."""
        return dict(self._get(f"/admin/messages/{message_id}"))

    def act(self, action: str, ids: list[int]) -> list[dict[str, Any]]:
        """Restart or cancel each of ``ids`` through the admin API; one result per id."""
        import httpx

        results = []
        for message_id in ids:
            try:
                response = self.http.post(f"/admin/messages/{message_id}/{action}", json={})
            except httpx.HTTPError as error:
                raise CliError(f"cannot reach {self.http.base_url}: {error}") from None
            if response.status_code in (404, 409):
                results.append({"id": message_id, "ok": False, "detail": response.json().get("reason")})
            else:
                results.append({"id": message_id, "ok": True, "detail": self._answer(response)["state"]})
        return results
