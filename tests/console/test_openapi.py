"""The OpenAPI description of the admin API: served, valid OpenAPI 3.1, every admin route described and no other."""

from __future__ import annotations

import re

import httpx
import pytest
from openapi_spec_validator import validate

from openroute.admin import AdminApi
from openroute.admin.openapi import admin_openapi
from openroute.engine import Engine
from tests.console.conftest import World


async def test_openapi_is_served_without_credentials_and_valid(client: httpx.AsyncClient) -> None:
    response = await client.get("/admin/openapi.json")
    assert response.status_code == 200
    document = response.json()
    validate(document)
    assert document == admin_openapi("/admin")


def _routes(engine: Engine) -> set[tuple[str, str]]:
    described = set()
    for route in AdminApi(engine, None).routes():
        for method in route.methods or ():
            if method != "HEAD":
                described.add((re.sub(r"\{(\w+)(:\w+)?\}", r"{\1}", route.path), method.lower()))
    return described


async def test_every_admin_route_is_described_and_nothing_else(world: World) -> None:
    document = admin_openapi("/admin")
    described = {(path, method) for path, item in document["paths"].items() for method in item}
    assert described == _routes(world.engine)
    for path, item in document["paths"].items():
        for method, operation in item.items():
            assert operation.get("summary"), (path, method)
            assert "200" in operation["responses"], (path, method)
            for name in re.findall(r"\{(\w+)\}", path):
                assert any(p["name"] == name and p["in"] == "path" for p in operation.get("parameters", [])), name


async def test_the_search_parameters_described_are_the_ones_accepted(client: httpx.AsyncClient) -> None:
    from tests.console.conftest import ADMIN

    search = admin_openapi()["paths"]["/admin/messages"]["get"]
    names = {p["name"] for p in search["parameters"]}
    for name in names - {"state", "cursor", "limit", "page_size", "received_from", "received_to"}:
        response = await client.get("/admin/messages", params={name: "x"}, headers=ADMIN)
        assert response.status_code == 200, (name, response.text)
    refused = await client.get("/admin/messages", params={"undescribed": "x"}, headers=ADMIN)
    assert refused.status_code == 400


async def test_the_document_is_rendered_once(client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unauthenticated request does not cost a document: the first request renders it, the next ones send it."""
    made: list[str] = []

    def counted(prefix: str = "/admin") -> dict[str, object]:
        made.append(prefix)
        return admin_openapi(prefix)

    monkeypatch.setattr("openroute.admin.api.admin_openapi", counted)
    answers = [await client.get("/admin/openapi.json") for _ in range(3)]
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert answers[0].headers["content-type"] == "application/json"
    assert all(answer.json() == admin_openapi("/admin") for answer in answers)
    assert made == ["/admin"]  # once per node (the fixture makes a new node per test)
