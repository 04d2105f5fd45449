"""openroute/inbound/openapi.py: the JSON contract generated from the routes, valid OpenAPI 3.1, served with
Swagger UI from the node's own files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate
from openroute.persistence import MessageStore
from pydantic import BaseModel, Field

from openroute import Application, Engine, EngineSettings, route
from openroute.inbound.openapi import ERROR_CODES, inbound_openapi
from openroute.server import create_app


class Line(BaseModel):
    """One order line."""

    sku: str
    quantity: int = Field(gt=0)


class Order(BaseModel):
    """An order."""

    orderId: str
    lines: list[Line]


def application() -> Application:
    return Application(
        route("shop", "createOrder").soap().json().body(Order).process(lambda exchange: None),
        route("shop", "note").json().process(lambda exchange: None),
        route("shop", "soapOnly").soap().process(lambda exchange: None),
    )


def test_one_operation_per_json_route_with_the_models_schema_or_any_object() -> None:
    app = application()
    assert app.bindings is not None
    document = inbound_openapi(app.bindings, app.routes)
    validate(document)
    assert set(document["paths"]) == {"/api/shop/createOrder", "/api/shop/note"}
    typed = document["paths"]["/api/shop/createOrder"]["post"]
    assert typed["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Order"}
    schemas = document["components"]["schemas"]
    assert schemas["Order"]["required"] == ["orderId", "lines"]
    assert schemas["Order"]["properties"]["lines"]["items"] == {"$ref": "#/components/schemas/Line"}
    assert schemas["Line"]["properties"]["quantity"]["exclusiveMinimum"] == 0
    untyped = document["paths"]["/api/shop/note"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert untyped["type"] == "object"
    answers = typed["responses"]
    assert set(answers) == {"200", "202", "400", "404", "413", "415", "429", "500", "503"}
    assert "INVALID_BODY" in answers["400"]["description"]
    assert set(schemas["Error"]["properties"]["error"]["enum"]) >= {"INVALID_BODY", "PAYLOAD_TOO_LARGE",
                                                                   "UNSUPPORTED_MEDIA_TYPE", "NODE_NOT_ACCEPTING"}
    secured = inbound_openapi(app.bindings, app.routes, prefix="/in", secured=True)
    validate(secured)
    assert set(secured["paths"]) == {"/in/shop/createOrder", "/in/shop/note"}
    assert {"401", "403"} <= set(secured["paths"]["/in/shop/note"]["post"]["responses"])
    assert set(secured["components"]["securitySchemes"]) == {"basic", "apiKey"}


def test_the_rough_edges_a_reader_of_swagger_ui_met_are_gone() -> None:
    """Issue 42: the WSDL's path shown as ``/soap/?wsdl`` (Swagger UI's markdown ate ``<service>``), the duplicate's
    example saying ACCEPTED, "a Order", and X-Source-System not marked required on an open node."""
    app = application()
    assert app.bindings is not None
    document = inbound_openapi(app.bindings, app.routes)
    validate(document)
    assert "`GET /soap/{service}?wsdl`" in document["info"]["description"]
    assert "<" not in str(document["info"]) and "<" not in str(document["paths"])
    typed = document["paths"]["/api/shop/createOrder"]["post"]
    examples = {status: typed["responses"][status]["content"]["application/json"]["example"] for status in
                ("200", "202")}
    assert (examples["200"]["status"], examples["202"]["status"]) == ("DUPLICATE", "ACCEPTED")
    assert examples["202"]["state"] == "NEW"
    assert typed["summary"] == "send createOrder to shop" and "Body: Order (schema below)." in typed["description"]
    assert " a Order" not in str(document)
    headers = {p["name"]: p.get("required", False) for p in typed["parameters"]}
    assert headers == {"X-Correlation-Id": False, "X-Source-System": True, "X-Process-Id": False,
                       "X-Message-Timestamp": False}
    secured = inbound_openapi(app.bindings, app.routes, secured=True)
    parameters = secured["paths"]["/api/shop/note"]["post"]["parameters"]
    source = next(p for p in parameters if p["name"] == "X-Source-System")
    assert source.get("required", False) is False  # with credentials the system is the authenticated one


def test_the_reference_applications_contract_describes_its_typed_bodies() -> None:
    from openroute.loading import load_application

    reference = load_application("openroute_reference:registry")
    assert reference.bindings is not None
    document = inbound_openapi(reference.bindings, reference.routes)
    validate(document)
    schemas = document["components"]["schemas"]
    assert {"Customer", "TariffChange", "Order", "OrderLine"} <= set(schemas)
    assert schemas["Customer"]["properties"]["msisdn"]["pattern"] == "^[0-9]{8,15}$"
    body = document["paths"]["/api/crm/setCustomer"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/Customer"}


def test_the_described_error_codes_are_the_ones_the_endpoints_answer() -> None:
    from openroute.auth.errors import (
        AuthenticationError,
        BodyTooLargeError,
        ForbiddenError,
        MalformedPayloadError,
        NestingTooDeepError,
        UnknownOperationError,
        UnsupportedMediaTypeError,
        status_and_code,
    )
    from openroute.definitions.body import InvalidBodyError
    from openroute.definitions.errors import NodeNotAcceptingError

    for error in (InvalidBodyError("Order", []), MalformedPayloadError("x"), NestingTooDeepError(3),
                  BodyTooLargeError(10), UnsupportedMediaTypeError("x"), UnknownOperationError("s", "o"),
                  AuthenticationError("x"), ForbiddenError("x"), NodeNotAcceptingError("n", "STOPPED")):
        status, code = status_and_code(error)
        assert code in ERROR_CODES[str(status)][1], (error, status, code)


async def test_the_document_and_swagger_ui_are_served_by_the_node_without_credentials(route_test_kit: Any) -> None:
    kit = await route_test_kit(application())
    served = await kit.client.get("/api/openapi.json")
    assert served.status_code == 200
    validate(served.json())
    page = await kit.client.get("/api/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "http://" not in page.text and "https://" not in page.text  # no CDN: every file comes from the node
    for asset in ("swagger-ui.css", "swagger-ui-bundle.js", "openroute-init.js"):
        assert f"/api/docs/{asset}" in page.text
        response = await kit.client.get(f"/api/docs/{asset}")
        assert response.status_code == 200 and len(response.content) > 50, asset
    assert "/api/openapi.json" in (await kit.client.get("/api/docs/openroute-init.js")).text
    init = (await kit.client.get("/api/docs/openroute-init.js")).text
    assert "validatorUrl: null" in init and "BaseLayout" in init  # no validator.swagger.io, no inline-styled top bar
    for unused in ("index.html", "swagger-ui-standalone-preset.js"):  # only the files the page needs
        assert (await kit.client.get(f"/api/docs/{unused}")).status_code == 404
    sent = await kit.send_json("shop", "note", {"text": "hello"})  # POST routes beside the GET ones still work
    assert sent.status_code == 202


@pytest.mark.browser
def test_swagger_ui_shows_the_operations_in_a_browser_that_reaches_no_other_host(
        sqlite_url: str, tmp_path: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests._support.servers import serving
    from tests.console.test_browser import CHROMEDRIVER, CHROMIUM, chromium_problem
    from tests.services import require

    require("Chromium", chromium_problem)
    app = application()
    store = MessageStore(sqlite_url)
    store.create_schema()
    engine = Engine(store, app.routes, EngineSettings(repoll_interval=None, node_id="swagger-ui"))
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                     "--disable-background-networking", f"--user-data-dir={tmp_path / 'chromium'}",
                     # every host but the node's loopback address is unreachable: a CDN file would not load
                     "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"):
        options.add_argument(argument)
    with serving(create_app(engine, app.bindings)) as url:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            driver.set_page_load_timeout(20)
            driver.get(f"{url}/api/docs")
            summaries = (By.CSS_SELECTOR, ".opblock-summary-path")
            WebDriverWait(driver, 20).until(lambda d: len(d.find_elements(*summaries)) >= 2)
            paths = {e.text.replace("\u200b", "") for e in driver.find_elements(*summaries)}
            assert paths == {"/api/shop/createOrder", "/api/shop/note"}
            assert driver.execute_script("return typeof SwaggerUIBundle") == "function"
        finally:
            driver.quit()
    store.dispose()
