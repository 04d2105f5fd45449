"""The one masking function of the store (``persistence/secrets.py``): a database URL's password, well-known secret
names and the names a configuration adds, in every form a text carries them. What never reaches an output (the CLI,
the server's start-up, the log, the Spark jobs) is tests/test_secrets.py."""

from __future__ import annotations

import pytest
from openroute.persistence import add_secret_names, mask_secrets, masked_url, masked_value

PLANTED = "Pl4ntedS3cret"
#: a PostgreSQL server that is not there (port 1 refuses), with a password that must never be printed
UNREACHABLE = f"postgresql+psycopg://ops:{PLANTED}@127.0.0.1:1/openroute"
#: a URL SQLAlchemy cannot parse (the port is not a number): its text must be masked all the same
MALFORMED = f"postgresql+psycopg://ops:{PLANTED}@127.0.0.1:notaport/openroute"


def test_masked_url_hides_the_password_of_urls_and_of_text_that_is_no_url() -> None:
    assert masked_url(UNREACHABLE) == "postgresql+psycopg://ops:***@127.0.0.1:1/openroute"
    assert PLANTED not in masked_url(MALFORMED)
    assert masked_url("sqlite:///openroute.db") == "sqlite:///openroute.db"
    text = f"connect {UNREACHABLE} failed; dsn host=db password={PLANTED} user=ops; jdbc:postgresql://u:{PLANTED}@h/d"
    masked = mask_secrets(text)
    assert PLANTED not in masked
    assert "host=db" in masked and "user=ops" in masked and "127.0.0.1:1/openroute" in masked

# -- the one masking function ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "shown"), [
    # a password with an unencoded "@": the host is what follows the last "@" before the path
    ("postgresql+psycopg://ops:p@ss@db:5432/x", "postgresql+psycopg://ops:***@db:5432/x"),
    ("see http://h:8080/users/a@b.com", "see http://h:8080/users/a@b.com"),  # an address in a path is no password
    # well-known secret names in query strings, forms, headers and "Password:" lines
    ("GET https://api.example/v1?apikey=A1&q=1&access_token=A2&sig=A3&api_key=A4&token=A5&secret=A6&x=2",
     "GET https://api.example/v1?apikey=***&q=1&access_token=***&sig=***&api_key=***&token=***&secret=***&x=2"),
    ("Authorization: Bearer A7\r\nX-Api-Key: A8\r\nHost: h", "Authorization: Bearer ***\r\nX-Api-Key: ***\r\nHost: h"),
    ("Password: A9\nUser: bob", "Password: ***\nUser: bob"),
    ("host=db password=A10 user=ops", "host=db password=*** user=ops"),
    # JSON anywhere in a text: with a byte order mark, trailing text, or inside a JSON string
    ('\ufeff{"password": "a\\"b", "n": 1, "refresh_token": 7} and more',
     '\ufeff{"password": "***", "n": 1, "refresh_token": "***"} and more'),
    ('{"body": "{\\"password\\": \\"A11\\", \\"ok\\": 1}"}', '{"body": "{\\"password\\": \\"***\\", \\"ok\\": 1}"}'),
    # XML: an element (CDATA too, any prefix) and an attribute, the element kept whole
    ("<s:Body><h:password><![CDATA[A12]]></h:password><next>1</next></s:Body>",
     "<s:Body><h:password>***</h:password><next>1</next></s:Body>"),
    ('<login user="a" password="A13"/><next>ok</next>', '<login user="a" password="***"/><next>ok</next>'),
    # camelCase: a name after a capital, or written without its separator; a name inside a word is none
    ('{"accessToken": "A16", "clientSecret": "A17"} ?refreshToken=A18&apiKey=A19&tokenType=bearer&design=1',
     '{"accessToken": "***", "clientSecret": "***"} ?refreshToken=***&apiKey=***&tokenType=bearer&design=1'),
])
def test_mask_secrets_masks_every_form_of_a_secret(text: str, shown: str) -> None:
    assert mask_secrets(text) == shown
    assert mask_secrets(shown) == shown  # masking twice changes nothing

def test_names_given_or_added_are_masked_and_json_values_are_masked_member_by_member() -> None:
    assert mask_secrets("<pin>1234</pin> pin=5678", ["pin"]) == "<pin>***</pin> pin=***"
    assert mask_secrets("<cvv2>123</cvv2>") == "<cvv2>123</cvv2>"
    add_secret_names(["cvv2"])  # the configuration's secret_names: masked everywhere in the process from now on
    assert mask_secrets("<cvv2>123</cvv2>") == "<cvv2>***</cvv2>"
    value = {"a": {"Password": 1, "urls": ["http://u:A14@h/"], "note": "apikey=A15"}, "pin": "9", "n": [1]}
    assert masked_value(value, ["pin"]) == {"a": {"Password": "***", "urls": ["http://u:***@h/"],
                                                  "note": "apikey=***"}, "pin": "***", "n": [1]}
    assert masked_url(f"postgresql://ops:{PLANTED}@x@db/openroute") == "postgresql://ops:***@db/openroute"
    assert masked_value({"accessToken": "A20", "Sigma": 1}) == {"accessToken": "***", "Sigma": 1}
    assert mask_secrets("cardNumber=A21 card-number: A22", ["card_number"]) == "cardNumber=*** card-number: ***"
