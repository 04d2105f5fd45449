"""BusinessError and TechnicalError take the same keywords (issue 26): ``code=`` and ``message=``."""

from __future__ import annotations

import pytest

from openroute import BusinessError, TechnicalError


def test_both_errors_take_code_and_message_keywords() -> None:
    business = BusinessError(code="NO_CREDIT", message="no credit")
    technical = TechnicalError(code="HLR_DOWN", message="hlr is down")
    assert (business.code, business.text, str(business)) == ("NO_CREDIT", "no credit", "NO_CREDIT: no credit")
    assert (technical.code, technical.text, str(technical)) == ("HLR_DOWN", "hlr is down", "hlr is down")


def test_the_documented_positional_forms_still_work() -> None:
    assert BusinessError("NO_CREDIT", "no credit").text == "no credit"
    assert BusinessError("NO_CREDIT", text="no credit").text == "no credit"  # the older keyword
    assert TechnicalError("down").code == "TECHNICAL_ERROR"
    assert TechnicalError("down", code="X").code == "X"


def test_the_opposite_order_is_refused_not_misread() -> None:
    with pytest.raises(TypeError):
        TechnicalError("down", "HLR_DOWN")  # type: ignore[misc]
    with pytest.raises(TypeError, match="message"):
        BusinessError("NO_CREDIT")
    with pytest.raises(TypeError, match="not both"):
        TechnicalError("down", text="down")
