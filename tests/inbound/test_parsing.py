"""The secure parse of untrusted XML (``openroute.inbound.parsing.parse_xml``): depth bounded, DTDs refused."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from lxml import etree

from openroute.auth.errors import ForbiddenXmlError, MalformedPayloadError, NestingTooDeepError
from openroute.inbound.parsing import parse_xml


def nested(levels: int, siblings: int = 0) -> bytes:
    """A document ``levels`` elements deep, with ``siblings`` shallow elements before the deep branch."""
    return b"<r>" + b"<s><t/></s>" * siblings + b"<a>" * (levels - 1) + b"</a>" * (levels - 1) + b"</r>"


@pytest.mark.parametrize("limit", [2, 3, 32, 64, 200])
def test_a_document_exactly_as_deep_as_the_limit_is_parsed_one_level_more_is_refused(limit: int) -> None:
    assert parse_xml(nested(limit), limit).tag == "r"
    with pytest.raises(NestingTooDeepError, match=f"limit of {limit} levels"):
        parse_xml(nested(limit + 1), limit)


def test_depth_counts_the_deepest_branch_of_a_wide_document() -> None:
    wide = nested(5, siblings=20_000)
    assert len(parse_xml(wide, 5)) == 20_001
    with pytest.raises(NestingTooDeepError):
        parse_xml(wide, 4)


def test_the_largest_depth_limit_works() -> None:
    # libxml2 itself refuses documents deeper than 256 levels (huge_tree is off), whatever the limit: that is the
    # effective limit for XML, and the answer says so (NESTING_TOO_DEEP, as documented)
    assert parse_xml(nested(255), 1000).tag == "r"
    with pytest.raises(NestingTooDeepError, match="limit of 256 levels"):
        parse_xml(nested(300), 1000)


def test_a_depth_limit_of_the_root_alone_refuses_any_child() -> None:
    assert parse_xml(b"<r>text</r>", 1).text == "text"
    with pytest.raises(NestingTooDeepError):
        parse_xml(b"<r><a/></r>", 1)


@pytest.mark.parametrize("body", [
    b'<!DOCTYPE r [<!ENTITY e "x">]><r>&e;</r>',
    b'<!DOCTYPE r SYSTEM "http://127.0.0.1:9/r.dtd"><r/>',
    '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE r [<!ENTITY e "x">]><r/>'.encode("utf-16"),
    '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE r [<!ENTITY e "x">]><r/>'.encode("utf-16-le"),  # no BOM
    b'<?xml version="1.0" encoding="UTF-8"?><!DOCTYPE r [<!ENTITY e "x">]><r>&e;</r>',
    # an ASCII declaration of UTF-7, whose "+ADw-" is "<": the byte scan finds no DOCTYPE, libxml2 reads one
    b'<?xml version="1.0" encoding="UTF-7"?>+ADw-!DOCTYPE r+AD4-<r/>',
])
def test_a_doctype_is_refused(body: bytes) -> None:
    with pytest.raises(ForbiddenXmlError):
        parse_xml(body, 64)


@pytest.mark.parametrize("body", [b"", b"  ", b"<r>", b"<r>&undefined;</r>", b"not xml"])
def test_malformed_documents_are_refused(body: bytes) -> None:
    with pytest.raises(MalformedPayloadError):
        parse_xml(body, 64)


def test_comments_and_processing_instructions_are_dropped() -> None:
    root = parse_xml(b"<r><!-- c --><?pi x?><a/></r>", 64)
    assert [child.tag for child in root] == ["a"] and etree.tostring(root) == b"<r><a/></r>"


def nested_json(levels: int, brackets_in_strings: int = 0) -> bytes:
    """A JSON object ``levels`` containers deep (objects and arrays alternating), with bracket characters inside a
    string value that do not nest anything."""
    text = '{"s": "' + "{[" * brackets_in_strings + '", "a": 1}'
    for level in range(levels - 1, 1, -1):  # the outermost container is an object, as the endpoint requires
        text = f'{{"k": {text}}}' if level % 2 else f"[{text}]"
    if levels > 1:
        text = f'{{"k": {text}}}'
    return text.encode()


@pytest.mark.parametrize("limit", [2, 3, 32, 64])
@pytest.mark.parametrize("noise", [0, 100])
def test_json_exactly_as_deep_as_the_limit_is_parsed_one_level_more_is_refused(limit: int, noise: int) -> None:
    """The bracket count only lets small documents skip the walk; brackets inside strings never decide."""
    from openroute.inbound.parsing import parse_json

    assert parse_json(nested_json(limit, noise), limit)[1] is not None
    with pytest.raises(NestingTooDeepError, match=f"limit of {limit} levels"):
        parse_json(nested_json(limit + 1, noise), limit)


def test_the_reused_parser_words_errors_as_a_one_shot_parse_and_parses_again_after_one() -> None:
    with pytest.raises(MalformedPayloadError, match="Entity 'undefined' not defined"):
        parse_xml(b"<r>&undefined;</r>", 64)
    assert parse_xml(b"<r>ok</r>", 64).text == "ok"
    with pytest.raises(MalformedPayloadError, match="Premature end of data"):
        parse_xml(b"<r><a>", 64)
    assert parse_xml("<s>é</s>".encode("utf-16"), 64).text == "é"


def test_threads_parse_at_the_same_time_each_with_its_own_parser() -> None:
    def parse(n: int) -> str | None:
        return parse_xml(f"<r><n>{n}</n>{'<x/>' * (n % 50)}</r>".encode(), 64).findtext("n")

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(parse, range(400))) == [str(n) for n in range(400)]
