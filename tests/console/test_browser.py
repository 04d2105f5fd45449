"""The console in a real browser: headless Chromium from the distribution's packages, driven by Selenium.

Search, open a detail, restart a FAILED message and see it end OK, cancel, drain a node. With
``OPENROUTE_SCREENSHOTS=docs`` the screenshots of the main pages are written to docs/img/console-*.png.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openroute.confirmation import ConfirmationService, DefaultConfirmationCallback
from openroute.persistence import ConfirmationStatus, MessageState, MessageStore, NewMessage, NodeState, StoredMessage
from openroute.persistence.breaker import BreakerState, BreakerStore

from openroute import Exchange, Route, RouteRegistry
from openroute.console._search import short_time
from openroute.definitions.binding import ChannelBinding, InboundBinding
from openroute.definitions.errors import BusinessError, TechnicalError
from openroute.definitions.message import InboundMessage
from openroute.engine import Engine, EngineSettings, states
from openroute.inbound.channel import ChannelDelivery, ChannelInbound
from openroute.messaging import Message
from openroute.server import create_app
from tests._support.servers import serving
from tests.console.conftest import auth
from tests.services import require

pytestmark = pytest.mark.browser

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
WAIT = 20
#: the "CRM" the orders route calls: down until the test repairs it
CRM = {"down": True}


class KeptLog(DefaultConfirmationCallback):
    """The log's confirmation kept as rows, as a remote system's is (the console shows a confirmation's row)."""

    @property
    def durable(self) -> bool:
        return True


def chromium_problem() -> str | None:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(path)]
    if missing:
        return f"{' and '.join(missing)} missing (apt-get install -y chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


def _orders(exchange: Exchange) -> None:
    if "fail" in exchange.payload and CRM["down"]:
        raise BusinessError("CRM_REFUSED", "the CRM refused the customer")


def _billing(exchange: Exchange) -> None:
    raise TechnicalError("billing did not answer", code="BILLING_TIMEOUT")


def registry() -> RouteRegistry:
    return RouteRegistry([Route("orders", "create", [_orders]), Route("billing", "charge", [_billing])])


def inbound(correlation_id: str, payload: str, service: str = "orders", operation: str = "create") -> InboundMessage:
    return InboundMessage(service=service, operation=operation, payload=payload, content_type="application/json",
                          correlation_id=correlation_id, source_system="CRM", object_id=correlation_id)


#: the in-memory channel feeding orders/create, and its dead-letter channel
CHANNELS = {
    "openroute.messaging.incoming.orders-in.connector": "in-memory",
    "openroute.messaging.incoming.orders-in.source-system": "SHOP",
    "openroute.messaging.incoming.orders-in.dead-letter-channel": "orders-dead",
    "openroute.messaging.outgoing.orders-dead.connector": "in-memory",
}


class Served:
    def __init__(self, url: str, engine: Engine, ids: dict[str, int], finals: dict[int, threading.Event],
                 channels: ChannelInbound) -> None:
        self.url, self.engine, self.ids, self.finals, self.channels = url, engine, ids, finals, channels
        self.store = engine.store


async def _populate(store: MessageStore) -> dict[str, int]:
    worker = Engine(store, registry(), EngineSettings(repoll_interval=None, node_id="worker-1"))
    await worker.start()
    ids: dict[str, int] = {}
    for name, correlation, payload in (("failed", "order-17", '{"order": 17, "fail": true, "lines": [1, 2]}'),
                                       ("ok1", "order-18", '{"order": 18}'), ("ok2", "order-19", '{"order": 19}')):
        ids[name] = (await worker.accept(inbound(correlation, payload))).message_id
    ids["retrying"] = (await worker.accept(inbound("charge-5", '{"amount": 5}', "billing", "charge"))).message_id
    await worker.wait_idle(WAIT)
    await worker.stop()
    return ids


@pytest.fixture
def served(sqlite_url: str) -> Iterator[Served]:
    require("Chromium", chromium_problem)
    CRM["down"] = True
    store = MessageStore(sqlite_url)
    store.create_schema()
    ids = asyncio.run(_populate(store))
    engine = Engine(store, registry(), EngineSettings(repoll_interval=None, node_id="console-node"))
    finals: dict[int, threading.Event] = {}

    async def on_final(message: StoredMessage) -> None:
        finals.setdefault(message.id, threading.Event()).set()

    engine.on_final_state(on_final)
    # confirmations kept as rows: a message that ends OK is confirmed (to the log) right after its commit, its row SENT
    confirmation = ConfirmationService(store, KeptLog())
    # orders also come from an in-memory channel (its dead letters to another): the dashboard shows its counters
    channels = ChannelInbound(engine, [ChannelBinding("orders-in", "orders", "create", json=InboundBinding(
        "orders", "create", "json", required=("$.order",)))], CHANNELS, environ={})
    with serving(create_app(engine, admin_auth=auth(), confirmation=confirmation, channels=channels)) as url:
        yield Served(url, engine, ids, finals, channels)
    store.dispose()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync", "--no-first-run",
                     "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium'}", "--window-size=1280,900",
                     # a host name other than localhost (Swagger UI treats localhost apart): the node, on loopback
                     "--host-resolver-rules=MAP openroute.test 127.0.0.1"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console log: CSP violations land there
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT)
    credentials = base64.b64encode(b"ops:ops-secret").decode()
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {credentials}"}})
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver: Any, name: str, tmp_path: Path) -> None:
    """Full-page screenshot (the whole document, through the DevTools protocol: a window resized to the page's
    height still cut it at the viewport); copied to docs/img/ when OPENROUTE_SCREENSHOTS=docs."""
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 4000), "scale": 1}
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                             "clip": clip})
    target = tmp_path / f"console-{name}.png"
    target.write_bytes(base64.b64decode(shot["data"]))
    if os.environ.get("OPENROUTE_SCREENSHOTS") == "docs":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(target, DOCS_IMG / target.name)


def text(driver: Any, element_id: str) -> str:
    """The element's text; the console's live refresh may replace the element between finding and reading it,
    so a stale element is looked up again (a bounded number of times)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(5):
        try:
            return str(driver.find_element(By.ID, element_id).text)
        except StaleElementReferenceException:
            continue
    return str(driver.find_element(By.ID, element_id).text)


def _replaced(old: Any) -> Callable[[Any], bool]:
    """A wait condition: ``old`` (an element of the page before a click) no longer belongs to the document.

    Selenium's ``staleness_of`` knows only StaleElementReferenceException; Chromium may instead answer, while the next
    page replaces the old one, "Node with given id does not belong to the document", which means the same."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    def check(_driver: Any) -> bool:
        try:
            old.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as error:
            if "does not belong to the document" in str(error):
                return True
            raise
        return False

    return check


def click(driver: Any, element_id: str) -> None:
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    old = driver.find_element(By.TAG_NAME, "html")
    for attempt in range(3):
        try:
            WebDriverWait(driver, WAIT).until(expected_conditions.element_to_be_clickable((By.ID, element_id))).click()
            break
        except (StaleElementReferenceException, WebDriverException) as error:
            # Chromium sometimes resolves the element while the page still settles ("Node with given id does not
            # belong to the document"): nothing was clicked, so look it up again, as long as the page is the same
            detached = isinstance(error, StaleElementReferenceException) or "does not belong to the document" in str(
                error)
            if _replaced(old)(driver):
                break  # the page changed after all: the click went through
            if attempt == 2 or not detached:
                raise
    WebDriverWait(driver, WAIT).until(_replaced(old))  # the next page has loaded


def test_search_detail_restart_cancel_and_drain_in_a_browser(served: Served, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    ids, console = served.ids, f"{served.url}/console"
    browser.get(f"{console}/")
    assert text(browser, "count-FAILED") == "1" and text(browser, "count-OK") == "2"
    assert text(browser, "count-PARTLY_FAILED") == "1"
    assert "orders/create" in text(browser, "failing-routes")
    shot(browser, "dashboard", tmp_path)

    # search: FAILED messages of the orders service
    click(browser, "nav-messages")
    browser.find_element(By.CSS_SELECTOR, "input[name=state][value=FAILED]").click()
    browser.find_element(By.ID, "f-service").send_keys("orders")
    click(browser, "search")
    listed = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "a[id^=open-]")]
    assert listed == [str(ids["failed"])]
    assert "state=FAILED" in browser.current_url and "service=orders" in browser.current_url
    browser.get(f"{console}/messages")
    shot(browser, "messages", tmp_path)

    # open the detail of the FAILED message
    browser.get(f"{console}/messages?state=FAILED")
    click(browser, f"open-{ids['failed']}")
    assert text(browser, "state") == "FAILED"
    assert "CRM_REFUSED" in text(browser, "last-error")
    assert '"lines": [\n    1,\n    2\n  ]' in text(browser, "payload")
    assert "NEW PROCESSING" in " ".join(text(browser, "transitions").split())
    shot(browser, "message", tmp_path)

    # the CRM is repaired; restart the message and see it end OK
    CRM["down"] = False
    finished = served.finals.setdefault(ids["failed"], threading.Event())
    finished.clear()
    click(browser, "restart")
    assert text(browser, "notice") == "Restarted."
    assert finished.wait(WAIT), "the restarted message did not reach a final state"
    browser.refresh()
    assert text(browser, "state") == "OK"
    assert "console:ops" in text(browser, "transitions")
    assert served.store.get(ids["failed"]).state is MessageState.OK

    # cancel the message waiting for its next attempt
    browser.get(f"{console}/messages/{ids['retrying']}")
    assert text(browser, "state") == "PARTLY_FAILED"
    click(browser, "cancel")
    assert text(browser, "state") == "CANCEL" and text(browser, "notice") == "Cancelled."
    assert served.store.get(ids["retrying"]).state is MessageState.CANCEL

    # drain this node: it refuses new messages from then on
    click(browser, "nav-nodes")
    assert text(browser, "state-console-node") == "RUN"
    click(browser, "HANDLES_EXISTING_MESSAGES-console-node")
    assert text(browser, "state-console-node") == "HANDLES_EXISTING_MESSAGES"
    assert served.store.nodes.state_of("console-node") is NodeState.HANDLES_EXISTING_MESSAGES
    shot(browser, "nodes", tmp_path)
    refused = httpx.post(f"{served.url}/api/orders/create", json={"order": 20},
                         headers={"X-Correlation-Id": "order-20", "X-Source-System": "CRM"}, timeout=WAIT)
    assert refused.status_code == 503 and refused.json()["error"] == "NODE_NOT_ACCEPTING"

    click(browser, "nav-errors")
    # the catalogue counts current errors: the restarted message ended OK, its CRM_REFUSED is history now
    catalogue = text(browser, "error-codes")
    assert "CANCELLED engine an operator cancelled the message" in catalogue and "CRM_REFUSED" not in catalogue
    shot(browser, "errors", tmp_path)

    # the list's "select all" is the console's own script file: it runs under the content policy
    browser.get(f"{console}/messages")
    browser.find_element(By.ID, "select-all").click()
    boxes = browser.find_elements(By.CSS_SELECTOR, "input[name=id]")
    assert boxes and all(box.is_selected() for box in boxes)
    browser.get(f"{console}/")
    heights = {bar.get_attribute("class") for bar in browser.find_elements(By.CSS_SELECTOR, ".bars .bar")}
    assert heights and all(h.startswith("bar h") for h in heights)

    # no page of the console broke its content policy; the policy is there (an inline script is refused)
    violations = [e["message"] for e in browser.get_log("browser") if "Content Security Policy" in e["message"]]
    assert violations == []
    browser.execute_script("const s = document.createElement('script'); s.textContent = 'window.x = 1';"
                           "document.body.appendChild(s)")
    refused = [e["message"] for e in browser.get_log("browser") if "Content Security Policy" in e["message"]]
    assert refused and "inline script" in refused[0], refused
    assert browser.execute_script("return window.x === undefined")
    page = httpx.get(f"{console}/messages", auth=("ops", "ops-secret"), timeout=WAIT)
    assert page.headers["x-frame-options"] == "DENY" and page.headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert "'unsafe-inline'" not in page.headers["content-security-policy"]

def test_what_waits_shows_on_the_list_and_the_detail_in_a_browser(served: Served, browser: Any,
                                                                    tmp_path: Path) -> None:
    """Issue 42: the dashboard's open breaker with its parked messages, the list's "Next attempt" column (a due time,
    or what a message waits for), the bulk actions above the results on screen, and a message whose confirmation
    was sent shows no next attempt at all."""
    from dataclasses import replace
    from datetime import UTC, datetime, timedelta

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    console = f"{served.url}/console"
    retrying = served.store.get(served.ids["retrying"])
    assert retrying.state is MessageState.PARTLY_FAILED and retrying.next_attempt_at is not None
    now = datetime.now(UTC)
    stored = served.store.insert_message(NewMessage(
        service="orders", operation="create", payload='{"order": 21}', content_type="application/json",
        correlation_id="order-21", source_system="CRM", receive_ts=now)).message
    claimed = states.claim(served.store, [stored], "worker-1", now)[0]
    parked = states.transition(served.store, claimed, MessageState.POSTPONED, now, {
        "parked_on": "PAYMENTS", "next_attempt_at": None, "last_error_code": "CIRCUIT_OPEN",
        "last_error_text": "circuit breaker of PAYMENTS is OPEN"})

    # the dashboard names the system holding it back: its breaker, since when, and how many messages are parked
    breakers = BreakerStore(served.store)
    closed = breakers.load("PAYMENTS", now)
    assert breakers.replace(closed, replace(closed, state=BreakerState.OPEN, changed_at=now, version=closed.version + 1,
                                            open_until=now + timedelta(seconds=30)))
    browser.get(f"{console}/")
    held = text(browser, "held-back-PAYMENTS")
    assert held.startswith("PAYMENTS OPEN") and held.endswith(" 1"), held
    assert browser.find_element(By.ID, "held-back-PAYMENTS").find_element(By.TAG_NAME, "a").get_attribute(
        "href").endswith("/messages?state=POSTPONED&error_code=CIRCUIT_OPEN")
    shot(browser, "dashboard-waiting", tmp_path)

    browser.get(f"{console}/messages?state=PARTLY_FAILED&state=POSTPONED&state=FAILED")
    assert text(browser, f"next-{retrying.id}") == short_time(retrying.next_attempt_at)
    assert text(browser, f"next-{parked.id}") == "when the breaker of PAYMENTS closes"
    assert text(browser, f"next-{served.ids['failed']}") == ""
    header = [cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#results th")]
    assert header[-1] == "Next attempt"
    # the actions on the whole list are on screen above the table, not after its last row
    table_top = browser.find_element(By.ID, "results").location["y"]
    for action in ("restart-matching", "bulk-restart", "bulk-cancel"):
        assert browser.find_element(By.ID, action).location["y"] < table_top, action
    shot(browser, "messages-waiting", tmp_path)
    click(browser, "restart-matching")
    assert text(browser, "restart-count").startswith("1 message in FAILED")
    shot(browser, "restart-matching", tmp_path)

    # a message that ends OK is confirmed at once: its page shows the confirmation SENT and no next attempt
    response = httpx.post(f"{served.url}/api/orders/create", json={"order": 22},
                          headers={"X-Correlation-Id": "order-22", "X-Source-System": "CRM"}, timeout=WAIT)
    assert response.status_code == 202
    confirmed = response.json()["messageId"]
    assert served.finals.setdefault(confirmed, threading.Event()).wait(WAIT), "the message did not end"
    browser.get(f"{console}/messages/{confirmed}")

    def sent(driver: Any) -> bool:  # the confirmation is sent after the commit that made the message OK
        driver.refresh()
        return text(driver, "confirmation-status") == ConfirmationStatus.SENT.value

    WebDriverWait(browser, WAIT, poll_frequency=0.2).until(sent)
    assert text(browser, "state") == "OK"
    assert text(browser, "confirmation-next-attempt") == "" and text(browser, "next-attempt") == ""
    shot(browser, "message-confirmed", tmp_path)


def test_the_dashboard_shows_this_nodes_channels_in_a_browser(served: Served, browser: Any, tmp_path: Path) -> None:
    """Issue 42: a channel's deliveries by outcome on the dashboard, refreshed by themselves, the dead letters with
    the reason of the last one; the AsyncAPI document describes the channel."""
    from selenium.webdriver.support.ui import WebDriverWait

    console = f"{served.url}/console"
    browser.get(f"{console}/")
    assert text(browser, "channel-orders-in-accepted") == "0"
    source = served.channels.app.connector("in-memory").source("orders-in")

    def deliver(body: str, message_id: str) -> Any:  # from this thread: the node's loop is uvicorn's
        delivered = source.send(Message(body, (ChannelDelivery(message_id=message_id,
                                                               content_type="application/json"),)))
        return delivered.result(WAIT)

    deliver('{"order": 40}', "order-40")
    deliver('{"order": 40}', "order-40")
    deliver('{"lines": []}', "order-41")  # no order: refused for good, into orders-dead (then acked)
    WebDriverWait(browser, WAIT).until(lambda driver: text(driver, "channel-orders-in-accepted") == "1")
    assert text(browser, "channel-orders-in-duplicate") == "1"
    assert text(browser, "channel-orders-in-dead_lettered") == "1 to orders-dead"
    assert "VALIDATION_ERROR required $.order is missing or empty" in text(browser, "channel-orders-in-last-refused")
    shot(browser, "dashboard-channels", tmp_path)
    document = httpx.get(f"{served.url}/api/asyncapi.json", timeout=WAIT).json()
    assert document["channels"]["orders-in"]["summary"] == "feeds route orders/create"


def test_the_console_refreshes_by_itself_and_shows_a_traceback(served: Served, browser: Any) -> None:
    """Issue 26: counts and lists refresh every 5 s without a reload, the refresh can be paused, and the detail
    page shows the traceback of a step's unexpected error."""
    from datetime import UTC, datetime

    from openroute.persistence import NewMessage
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from openroute.engine import states

    console = f"{served.url}/console"
    browser.get(f"{console}/")
    assert text(browser, "count-NEW") == "0"
    browser.execute_script("window.sameDocument = true")  # gone if the page were reloaded
    stored = served.store.insert_message(NewMessage(
        service="orders", operation="create", payload="{}", content_type="application/json",
        correlation_id="order-live", source_system="CRM", receive_ts=datetime.now(UTC))).message
    WebDriverWait(browser, WAIT).until(lambda driver: text(driver, "count-NEW") == "1")
    assert browser.execute_script("return window.sameDocument") is True

    # the list of a search refreshes too, and the operator can stop it
    browser.get(f"{console}/messages?state=NEW")
    assert browser.execute_script("return window.openrouteLive.running()") is True
    now = datetime.now(UTC)
    claimed = states.claim(served.store, [stored], "console-node", now)[0]
    trace = 'Traceback (most recent call last):\n  File "steps.py", line 9, in enrich\nKeyError: \'customer\''
    states.transition(served.store, claimed, MessageState.PARTLY_FAILED, now, {
        "failed_count": 1, "last_error_code": "KeyError", "last_error_text": "KeyError: 'customer'",
        "last_error_trace": trace})
    WebDriverWait(browser, WAIT).until(lambda driver: "0 matching" in text(driver, "result-count"))
    browser.find_element(By.ID, "live-toggle").click()
    assert browser.find_element(By.ID, "live-toggle").text == "resume refresh"
    assert browser.execute_script("return window.openrouteLive.running()") is False
    browser.refresh()  # paused stays paused in this browser
    assert browser.execute_script("return window.openrouteLive.running()") is False
    browser.find_element(By.ID, "live-toggle").click()
    assert browser.execute_script("return window.openrouteLive.running()") is True

    # the detail shows the traceback of the failed step
    browser.get(f"{console}/messages/{stored.id}")
    assert "KeyError" in text(browser, "last-error")
    assert 'File "steps.py", line 9, in enrich' in browser.find_element(By.ID, "last-error-trace").text
    trace_cell = browser.find_element(By.CSS_SELECTOR, "details.trace")
    trace_cell.find_element(By.TAG_NAME, "summary").click()
    assert "KeyError: 'customer'" in trace_cell.find_element(By.TAG_NAME, "pre").text


def test_swagger_ui_keeps_the_content_policy_and_asks_no_validator(served: Served, browser: Any) -> None:
    """/api/docs under a host name other than localhost: Swagger UI renders the routes (an operation opened), the
    console log shows no content policy violation (no inline style, no request to validator.swagger.io)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    port = served.url.rsplit(":", 1)[1]
    browser.get(f"http://openroute.test:{port}/api/docs")
    operation = WebDriverWait(browser, WAIT).until(
        expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, ".opblock-summary")))
    assert "/api/billing/charge" in operation.text
    operation.click()
    WebDriverWait(browser, WAIT).until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR,
                                                                                      ".opblock-body")))
    messages = [e["message"] for e in browser.get_log("browser")]
    assert not [m for m in messages if "Content Security Policy" in m or "validator" in m], messages
