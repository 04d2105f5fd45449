"""The web console against a real store (SQLite and PostgreSQL): pages, search, actions, CSRF, roles."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import sqlalchemy as sa
from openroute.persistence import MessageState, NodeState, message_table

from openroute.console._search import short_time
from openroute.console.app import pretty_payload
from tests.console.conftest import ADMIN, OTHER, WEB, World


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, "the page has no CSRF token"
    return found.group(1)


async def page(client: httpx.AsyncClient, path: str, headers: dict[str, str] = ADMIN, status: int = 200) -> str:
    response = await client.get(path, headers=headers)
    assert response.status_code == status, response.text[-600:]
    return response.text


def ids_listed(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'id="open-(\d+)"', html)]


async def test_dashboard_counts_routes_oldest_and_failing(client: httpx.AsyncClient, world: World) -> None:
    html = await page(client, "/console/")
    assert 'id="count-FAILED">2<' in html and 'id="count-OK">1<' in html and 'id="count-NEW">3<' in html
    assert 'id="count-total">6<' in html
    assert "orders/create" in html and "billing/charge" in html
    oldest = re.search(r'<p id="oldest">(.*?)</p>', html, re.S)
    assert oldest and f"#{world.ids['new']}" in oldest.group(1)  # the oldest message that is not final
    failing = re.search(r'<table id="failing-routes">(.*?)</table>', html, re.S)
    assert failing and "billing/charge" in failing.group(1) and "REFUSED" in failing.group(1)
    assert "3 messages finished" in html  # two FAILED and one OK in the last hour


async def test_search_with_every_filter_and_keyset_pages(client: httpx.AsyncClient, world: World) -> None:
    ids = world.ids
    assert sorted(ids_listed(await page(client, "/console/messages"))) == sorted(ids.values())
    assert set(ids_listed(await page(client, "/console/messages?state=FAILED"))) == {ids["failed1"], ids["failed2"]}
    both = await page(client, "/console/messages?state=FAILED&state=OK&service=&operation=")  # blank fields ignored
    assert set(ids_listed(both)) == {ids["failed1"], ids["failed2"], ids["ok"]}
    for query, expected in [
        ("service=billing", {ids["failed2"]}),
        ("operation=charge", {ids["failed2"]}),
        ("source_system=ERP", {ids["failed2"], ids["new2"]}),
        ("correlation_id=n-1", {ids["new"]}),
        ("object_id=A-1", {ids["failed1"], ids["ok"]}),
        ("process_id=p-1", {ids["new"]}),
        ("entity_type=create&state=OK", {ids["ok"]}),
        ("received_from=2000-01-01T00:00:00%2B00:00&received_to=2999-01-01T00:00:00%2B00:00", set(ids.values())),
        ("received_from=2999-01-01T00:00:00%2B00:00", set()),
    ]:
        assert set(ids_listed(await page(client, f"/console/messages?{query}"))) == expected, query
    seen: list[int] = []
    path = "/console/messages?limit=4&source_system=CRM"
    while True:
        html = await page(client, path)
        seen.extend(ids_listed(html))
        found = re.search(r'href="(/console/messages\?[^"]*cursor=[^"]+)" id="next-page"', html)
        if not found:
            break
        path = found.group(1).replace("&amp;", "&")
        assert "source_system=CRM" in path  # the filters stay with the cursor
    assert seen == sorted(seen, reverse=True) and set(seen) == {i for n, i in ids.items() if n not in ("failed2",
                                                                                                      "new2")}


async def test_a_listed_row_shows_its_cells_and_times_to_the_millisecond(client: httpx.AsyncClient,
                                                                        world: World) -> None:
    failed = world.ids["failed2"]
    whole_second = datetime(2024, 3, 1, 10, 15, tzinfo=UTC)  # isoformat() leaves the fraction out of such a time
    with world.store.engine.begin() as connection:
        connection.execute(sa.update(message_table).where(message_table.c.id == failed)
                           .values(receive_ts=whole_second, last_update_ts=whole_second + timedelta(seconds=1.25),
                                   failed_count=2))
    html = await page(client, "/console/messages?correlation_id=f-2")
    row = re.search(rf'<tr class="row-FAILED">(.*?id="open-{failed}".*?)</tr>', html, re.S)
    assert row, html[-2000:]
    cells = re.findall(r"<td>(.*?)</td>", row.group(1), re.S)
    assert cells[-8:] == ["billing/charge", "ERP", "f-2", "", "2", "REFUSED", "2024-03-01 10:15:00.000",
                          "2024-03-01 10:15:01.250"]


def test_short_time_takes_a_time_or_its_iso_text() -> None:
    moment = datetime(2024, 3, 1, 10, 15, 0, 123456, tzinfo=UTC)
    assert short_time(moment) == short_time(moment.isoformat()) == "2024-03-01 10:15:00.123"
    assert short_time(moment.replace(microsecond=0)) == "2024-03-01 10:15:00.000"
    assert short_time(None) == short_time("") == ""
    assert short_time("never") == "never"  # not a time: shown as it is, the page still renders


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("state=BROKEN", "unknown state"),
        ("colour=red", "unknown search parameters"),
        ("cursor=%21%21not-a-cursor", "is not one this search returned"),
        ("limit=0", "limit must be in"),
        ("limit=x", "must be an integer"),
        ("received_from=yesterday", "ISO 8601"),
        ("received_from=2024-01-01T00:00:00", "time zone"),
    ],
)
async def test_bad_search_input_is_a_400_page(client: httpx.AsyncClient, world: World, query: str,
                                              reason: str) -> None:
    html = await page(client, f"/console/messages?{query}", status=400)
    assert reason in html.replace("&#39;", "'")


async def test_detail_shows_everything_stored(client: httpx.AsyncClient, world: World) -> None:
    html = await page(client, f"/console/messages/{world.ids['failed1']}")
    assert 'id="state">FAILED<' in html
    assert '"customer": {\n    "id": "A-1"\n  }' in html.replace("&#34;", '"')  # pretty-printed JSON
    assert "REFUSED" in html and "customer blocked" in html  # last error and business errors
    calls = re.search(r'<table id="external-calls">(.*?)</table>', html, re.S)
    assert calls and "billing.charge" in calls.group(1) and "invoice" in calls.group(1).replace("&#34;", '"')
    assert f'href="/console/messages/{world.ids["child"]}"' in html  # children
    confirmation = re.search(r'<table class="facts" id="confirmation">(.*?)</table>', html, re.S)
    assert confirmation and "HTTP 500: down" in confirmation.group(1)
    path = re.search(r'<table id="transitions">(.*?)</table>', html, re.S)
    assert path and [s for s in re.findall(r"state-(\w+)", path.group(1))] == ["NEW", "PROCESSING", "FAILED"]
    assert 'id="restart"' in html and 'id="cancel"' not in html
    child = await page(client, f"/console/messages/{world.ids['child']}")
    assert f'id="parent">#{world.ids["failed1"]}<' in child
    xml = await page(client, f"/console/messages/{world.ids['failed2']}")
    assert "&lt;charge&gt;\n  &lt;fail&gt;2&lt;/fail&gt;" in xml  # pretty-printed XML, escaped
    await page(client, "/console/messages/999999", status=404)
    await page(client, "/console/messages/abc", status=400)


def test_pretty_payload_leaves_what_it_cannot_read() -> None:
    assert pretty_payload('{"a": [1]}') == '{\n  "a": [\n    1\n  ]\n}'
    assert pretty_payload("{broken") == "{broken"
    assert pretty_payload("<a><b/></a>") == "<a>\n  <b/>\n</a>\n"
    evil = '<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]><x>&e;</x>'
    assert "root:" not in pretty_payload(evil)
    assert pretty_payload("plain text") == "plain text"


async def test_restart_and_cancel_go_through_the_engine(client: httpx.AsyncClient, world: World) -> None:
    heard: list[tuple[MessageState | None, MessageState]] = []
    world.engine.on_transition(lambda previous, message: heard.append((previous, message.state)))
    failed, new = world.ids["failed1"], world.ids["new"]
    token = csrf_of(await page(client, f"/console/messages/{failed}"))
    response = await client.post(f"/console/messages/{failed}/restart", data={"csrf": token}, headers=ADMIN)
    assert response.status_code == 303 and response.headers["location"] == f"/console/messages/{failed}?done=restarted"
    assert world.store.get(failed).state is MessageState.PARTLY_FAILED
    response = await client.post(f"/console/messages/{new}/cancel", data={"csrf": token}, headers=ADMIN)
    assert response.status_code == 303
    cancelled = world.store.get(new)
    assert cancelled.state is MessageState.CANCEL and cancelled.last_error_text == "cancelled by operator ops"
    assert heard == [(MessageState.FAILED, MessageState.PARTLY_FAILED), (MessageState.NEW, MessageState.CANCEL)]
    assert world.engine.stats.outcomes[MessageState.CANCEL] == 1
    assert world.store.transitions.of(new)[-1]["cause"] == "console:ops"
    shown = await page(client, f"/console/messages/{new}?done=cancelled")
    assert 'id="notice">Cancelled.<' in shown and 'id="restart"' in shown
    again = await client.post(f"/console/messages/{new}/cancel", data={"csrf": token}, headers=ADMIN)
    assert again.status_code == 409 and "CANCEL -&gt; CANCEL" in again.text
    assert (await client.post("/console/messages/424242/cancel", data={"csrf": token},
                              headers=ADMIN)).status_code == 404
    assert (await client.post(f"/console/messages/{new}/explode", data={"csrf": token},
                              headers=ADMIN)).status_code == 400


async def test_restart_and_cancel_of_the_selected_messages(client: httpx.AsyncClient, world: World) -> None:
    ids = world.ids
    html = await page(client, "/console/messages?state=FAILED")
    token = csrf_of(html)
    response = await client.post("/console/messages/bulk", headers=ADMIN, data={
        "csrf": token, "action": "restart", "id": [str(ids["failed1"]), str(ids["failed2"]), str(ids["ok"])],
        "back": "state=FAILED"})
    assert response.status_code == 200
    rows = re.findall(r'<tr class="(ok|refused)"><td><a href="[^"]+">(\d+)</a></td><td>(.*?)</td>', response.text)
    assert [(kind, int(i)) for kind, i, _ in rows] == [("ok", ids["failed1"]), ("ok", ids["failed2"]),
                                                       ("refused", ids["ok"])]
    assert "OK -&gt; PARTLY_FAILED" in rows[2][2]
    assert 'href="/console/messages?state=FAILED" id="back"' in response.text
    assert {world.store.get(ids[n]).state for n in ("failed1", "failed2")} == {MessageState.PARTLY_FAILED}
    assert world.store.get(ids["ok"]).state is MessageState.OK
    cancel = await client.post("/console/messages/bulk", headers=ADMIN, data={
        "csrf": token, "action": "cancel", "id": [str(ids["new"]), str(ids["new2"])]})
    assert cancel.status_code == 200
    assert {world.store.get(ids[n]).state for n in ("new", "new2")} == {MessageState.CANCEL}


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"action": "restart"}, "select at least one message"),
        ({"action": "delete", "id": "1"}, "action must be restart or cancel"),
        ({"action": "cancel", "id": "x"}, "a message id is an integer"),
    ],
)
async def test_bad_bulk_forms_are_a_400(client: httpx.AsyncClient, world: World, data: dict[str, str],
                                        reason: str) -> None:
    token = csrf_of(await page(client, "/console/messages"))
    response = await client.post("/console/messages/bulk", headers=ADMIN, data={"csrf": token, **data})
    assert response.status_code == 400 and reason in response.text


async def test_an_action_without_the_csrf_token_is_refused(client: httpx.AsyncClient, world: World) -> None:
    failed, new = world.ids["failed1"], world.ids["new"]
    token = csrf_of(await page(client, "/console/messages"))
    attempts = [
        (f"/console/messages/{failed}/restart", {}, {}),
        (f"/console/messages/{failed}/restart", {"csrf": "0" * 64}, {}),
        (f"/console/messages/{new}/cancel", {"csrf": csrf_of(await page(client, "/console/messages", WEB))}, {}),
        ("/console/messages/bulk", {"action": "cancel", "id": str(new)}, {}),
        ("/console/nodes/console-node/state", {"state": "STOPPED"}, {}),
        # the right token, posted by a page of another site
        (f"/console/messages/{new}/cancel", {"csrf": token}, {"Origin": "https://evil.example"}),
    ]
    for path, data, extra in attempts:
        response = await client.post(path, data=data, headers={**ADMIN, **extra})
        assert response.status_code == 403, path
        assert "nothing was done" in response.text
    assert world.store.get(failed).state is MessageState.FAILED
    assert world.store.get(new).state is MessageState.NEW
    same_site = await client.post(f"/console/messages/{new}/cancel", data={"csrf": token},
                                  headers={**ADMIN, "Origin": "http://testserver"})
    assert same_site.status_code == 303


async def test_roles_web_reads_admin_acts(client: httpx.AsyncClient, world: World) -> None:
    for path in ("/console/", "/console/messages", f"/console/messages/{world.ids['failed1']}", "/console/nodes",
                 "/console/errors"):
        assert (await client.get(path)).status_code == 401
        assert (await client.get(path)).headers["www-authenticate"].startswith("Basic")
        assert (await client.get(path, headers=OTHER)).status_code == 403
        viewer = await page(client, path, WEB)
        assert 'id="restart"' not in viewer and 'id="bulk-restart"' not in viewer and "(read only)" in viewer
    token = csrf_of(await page(client, "/console/messages", WEB))
    refused = await client.post(f"/console/messages/{world.ids['failed1']}/restart", data={"csrf": token},
                                headers=WEB)
    assert refused.status_code == 403 and "&#39;admin&#39; role" in refused.text
    assert world.store.get(world.ids["failed1"]).state is MessageState.FAILED


async def test_console_without_users_is_closed(world: World) -> None:
    from openroute.server import create_app

    app = create_app(world.engine, manage_engine=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        response = await http.get("/console/", headers=ADMIN)
        assert response.status_code == 401 and "no users configured" in response.text


async def test_nodes_page_drains_a_node(client: httpx.AsyncClient, world: World) -> None:
    await world.engine.start()
    try:
        await world.engine.wait_idle(20)
        html = await page(client, "/console/nodes")
        assert 'id="state-console-node">RUN<' in html and 'id="state-worker">RUN<' in html
        response = await client.post("/console/nodes/console-node/state", headers=ADMIN,
                                     data={"csrf": csrf_of(html), "state": "HANDLES_EXISTING_MESSAGES"})
        assert response.status_code == 303 and response.headers["location"] == "/console/nodes?done=state"
        assert world.engine.node_state is NodeState.HANDLES_EXISTING_MESSAGES
        assert world.store.nodes.state_of("console-node") is NodeState.HANDLES_EXISTING_MESSAGES
        assert 'id="state-console-node">HANDLES_EXISTING_MESSAGES<' in await page(client, "/console/nodes")
        refused = await client.post("/api/orders/create", json={}, headers={"X-Correlation-Id": "d-1",
                                                                            "X-Source-System": "CRM"})
        assert refused.status_code == 503
        for data, status in (({"state": "ASLEEP"}, 400), ({}, 400)):
            bad = await client.post("/console/nodes/console-node/state", headers=ADMIN,
                                    data={"csrf": csrf_of(html), **data})
            assert bad.status_code == status
        missing = await client.post("/console/nodes/nobody/state", headers=ADMIN,
                                    data={"csrf": csrf_of(html), "state": "RUN"})
        assert missing.status_code == 404
    finally:
        await world.engine.stop()


async def test_error_catalogue_lists_defined_and_seen_codes(client: httpx.AsyncClient, world: World) -> None:
    await world.engine.cancel(world.ids["new"])
    html = await page(client, "/console/errors")
    refused = re.search(r'<tr id="code-REFUSED">(.*?)</tr>', html, re.S)
    assert refused and "route" in refused.group(1) and "<td>2</td>" in refused.group(1)
    cancelled = re.search(r'<tr id="code-CANCELLED">(.*?)</tr>', html, re.S)
    assert cancelled and "<td>1</td>" in cancelled.group(1)
    for code in ("INVALID_QUERY", "NODE_NOT_ACCEPTING", "UNAUTHENTICATED", "PROCESSING_ABANDONED", "CSRF"):
        assert f'id="code-{code}"' in html, code


async def test_processing_after_a_console_restart_ends_ok(client: httpx.AsyncClient, world: World) -> None:
    await world.engine.start()
    try:
        await world.engine.wait_idle(20)
        failed = world.ids["failed1"]
        # the step refuses "fail" payloads until custom data says restarted: let the restart succeed
        with world.store.begin() as connection:
            connection.execute(sa.update(message_table).where(message_table.c.id == failed)
                               .values(custom_data={"restarted": True}))
        token = csrf_of(await page(client, f"/console/messages/{failed}"))
        response = await client.post(f"/console/messages/{failed}/restart", data={"csrf": token}, headers=ADMIN)
        assert response.status_code == 303
        await world.engine.wait_idle(20)
        assert world.store.get(failed).state is MessageState.OK
        html = await page(client, f"/console/messages/{failed}")
        path = re.search(r'<table id="transitions">(.*?)</table>', html, re.S)
        assert path and re.findall(r"state-(\w+)", path.group(1))[-3:] == ["PARTLY_FAILED", "PROCESSING", "OK"]
        assert "console:ops" in path.group(1)
    finally:
        await world.engine.stop()


async def test_search_by_what_went_wrong_and_restart_all_matching(client: httpx.AsyncClient, world: World) -> None:
    """Issue 26: find the messages an outage hit (error code, error text, payload text), then restart them all in
    one action, after a confirmation that shows the count; through the engine, as one by one."""
    ids = world.ids
    failed = {ids["failed1"], ids["failed2"]}
    assert set(ids_listed(await page(client, "/console/messages?error_code=REFUSED"))) == failed
    assert set(ids_listed(await page(client, "/console/messages?error_code=REFUSED&error_code=X"))) == failed
    assert set(ids_listed(await page(client, "/console/messages?error_text=blocked&service=billing"))) == {
        ids["failed2"]}
    html = await page(client, "/console/messages?payload_text=%3Camount%3E10")
    assert ids_listed(html) == [ids["failed2"]]
    assert 'id="restart-matching"' in html and "data-live" in html and "/static/live.js" in html
    token = csrf_of(html)
    query = "error_code=REFUSED"
    asked = await client.post("/console/messages/restart-matching", data={"csrf": token, "query": query},
                              headers=ADMIN)
    assert asked.status_code == 200 and 'id="restart-count">2 messages in FAILED' in asked.text
    assert {world.store.get(i).state for i in failed} == {MessageState.FAILED}  # only asked, nothing done
    stale = await client.post("/console/messages/restart-matching", headers=ADMIN,
                              data={"csrf": token, "query": query, "confirm": "yes", "expected": "5"})
    assert 'id="count-changed"' in stale.text  # the count moved since the page was shown: asked again
    assert {world.store.get(i).state for i in failed} == {MessageState.FAILED}
    done = await client.post("/console/messages/restart-matching", headers=ADMIN,
                             data={"csrf": token, "query": query, "confirm": "yes", "expected": "2"})
    assert done.status_code == 200 and done.text.count('class="ok"') == 2
    assert {world.store.get(i).state for i in failed} == {MessageState.PARTLY_FAILED}
    assert {world.store.transitions.of(i)[-1]["cause"] for i in failed} == {"console:ops"}
    none_left = await client.post("/console/messages/restart-matching", data={"csrf": token, "query": query},
                                  headers=ADMIN)
    assert 'id="restart-count">0 messages' in none_left.text and 'id="confirm-restart"' not in none_left.text
    wrong = await client.post("/console/messages/restart-matching", headers=ADMIN,
                              data={"csrf": token, "query": "state=NEW"})
    assert wrong.status_code == 400 and "can be restarted" in wrong.text
    refused = await client.post("/console/messages/restart-matching", data={"query": query}, headers=ADMIN)
    assert refused.status_code == 403  # no CSRF token: nothing done


async def test_detail_shows_the_history_of_errors_and_the_traceback(client: httpx.AsyncClient,
                                                                    world: World) -> None:
    from datetime import UTC, datetime

    from openroute.engine import states

    message = world.store.get(world.ids["new2"])
    now = datetime.now(UTC)
    claimed = states.claim(world.store, [message], "n", now)[0]
    trace = 'Traceback (most recent call last):\n  File "step.py", line 3\nKeyError: \'customer\''
    failed = states.transition(world.store, claimed, MessageState.PARTLY_FAILED, now, {
        "failed_count": 1, "last_error_code": "KeyError", "last_error_text": "KeyError: 'customer'",
        "last_error_trace": trace})
    claimed = states.claim(world.store, [failed], "n", now)[0]
    states.transition(world.store, claimed, MessageState.OK, now, {
        "last_error_code": None, "last_error_text": None, "last_error_trace": None})
    html = await page(client, f"/console/messages/{message.id}")
    assert re.search(r'id="last-error">\s*</td>', html)  # OK: no current error
    assert "<b>KeyError</b> KeyError: &#39;customer&#39;" in html  # the failure stays in the state path
    assert 'id="trace-3"' in html and "File &#34;step.py&#34;, line 3" in html
