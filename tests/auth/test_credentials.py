"""A source system's credentials and the system a request claims to speak for, checked together."""

from __future__ import annotations

import base64

import pytest

from openroute.auth import SourceSystemAuth
from openroute.auth.credentials import BasicCredentials
from openroute.auth.errors import AuthenticationError, ForbiddenError


def _basic(user: str, password: str) -> dict[str, str]:
    return {"authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


AUTH = SourceSystemAuth({"CRM": BasicCredentials("crm", "crm-secret"), "ERP": BasicCredentials("erp", "erp-secret")})


def test_a_request_may_claim_the_system_it_proved_or_none() -> None:
    assert AUTH.authenticate(_basic("crm", "crm-secret"), "10.0.0.1", claimed="CRM") == "CRM"
    assert AUTH.authenticate(_basic("crm", "crm-secret"), "10.0.0.1", claimed=None) == "CRM"


def test_a_request_claiming_another_system_is_forbidden() -> None:
    with pytest.raises(ForbiddenError, match="authenticated as 'CRM', cannot send as 'ERP'"):
        AUTH.authenticate(_basic("crm", "crm-secret"), "10.0.0.1", claimed="ERP")


def test_wrong_credentials_are_refused_before_the_claim_is_looked_at() -> None:
    with pytest.raises(AuthenticationError):
        AUTH.authenticate(_basic("crm", "wrong"), "10.0.0.1", claimed="ERP")
