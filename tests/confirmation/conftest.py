"""Fixtures of the confirmation tests: a real local receiver of SOAP / JSON confirmations."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.confirmation.receiver import Receiver, ServerThread


@pytest.fixture(scope="module")
def _receiver_server() -> Iterator[Receiver]:
    receiver = Receiver()
    server = ServerThread(receiver)
    server.start()
    receiver.url = f"http://127.0.0.1:{server.port}"
    try:
        yield receiver
    finally:
        server.stop()


@pytest.fixture
def receiver(_receiver_server: Receiver) -> Receiver:
    """The running receiver, reset: no failures planned, nothing recorded."""
    _receiver_server.reset()
    return _receiver_server
