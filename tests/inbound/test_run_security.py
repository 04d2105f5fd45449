"""``openroute run`` against hostile clients, in a real process: a forged ``X-Forwarded-For`` or ``Forwarded``
changes no address unless ``[server] forwarded_allow_ips`` names the peer, and oversized headers are refused with
431 while the node's memory stays flat."""

from __future__ import annotations

import socket
import textwrap
import threading
from pathlib import Path

import httpx
import sqlalchemy as sa

from tests.inbound.test_cli_run import USER_APP, Server

#: where the forged requests claim to come from
FORGED = "203.0.113.66"


def _configure(folder: Path, extra: str = "") -> None:
    (folder / "shopapp.py").write_text(USER_APP, encoding="utf-8")
    (folder / "openroute.toml").write_text(textwrap.dedent('''
        database_url = "sqlite:///store.db"
        routes = "shopapp:app"
        [auth]
        max_failed_logins = 5
        max_failed_logins_per_address = 20
        [[auth.admins]]
        username = "ops"
        password = "ops-secret"
    ''') + textwrap.dedent(extra), encoding="utf-8")


def _failed_message(server: Server, correlation: str = "c-pay") -> int:
    """A message that ended FAILED (the route ``shop/pay`` always fails), by id."""
    headers = {"X-Source-System": "SHOP", "X-Correlation-Id": correlation}
    accepted = httpx.post(f"{server.base}/api/shop/pay", json={"n": 1}, headers=headers, timeout=10)
    assert accepted.status_code == 202, accepted.text
    message_id = int(accepted.json()["messageId"])
    server.wait_for(f"message {message_id} shop/pay PROCESSING -> FAILED")
    return message_id


def _restarted_from(server: Server, message_id: int, headers: dict[str, str]) -> str:
    """The audit line of a restart of ``message_id`` by ``ops`` sent with ``headers``."""
    restarted = httpx.post(f"{server.base}/admin/messages/{message_id}/restart", json={}, auth=("ops", "ops-secret"),
                           headers=headers, timeout=10)
    assert restarted.status_code == 200, restarted.text
    return server.wait_for(f"message {message_id} restarted by ops from")


def _guesses(server: Server, count: int, forged: bool, header: str = "X-Forwarded-For",
             value: str = "198.51.100.{n}") -> list[int]:
    """The statuses of ``count`` wrong passwords of ``ops``, each claiming another address in ``header`` (``value``
    with the guess's number) when ``forged``."""
    statuses = []
    with httpx.Client(base_url=server.base, timeout=10) as client:
        for n in range(count):
            headers = {header: value.format(n=n + 1)} if forged else {}
            statuses.append(client.get("/admin/counts", auth=("ops", f"guess-{n}"), headers=headers).status_code)
    return statuses


def test_a_forged_x_forwarded_for_from_an_untrusted_peer_changes_no_address(tmp_path: Path, serve) -> None:
    """By default no peer is a trusted proxy: the login limit counts the socket's address whatever the header says
    (429 after 5 failures), and the audit line of an action names the real peer."""
    _configure(tmp_path)
    server = serve(["--config", "openroute.toml"], cwd=tmp_path)
    server.wait_for("serving")
    message_id = _failed_message(server)
    restarted = httpx.post(f"{server.base}/admin/messages/{message_id}/restart", json={}, auth=("ops", "ops-secret"),
                           headers={"X-Forwarded-For": FORGED, "Forwarded": f"for={FORGED}"}, timeout=10)
    assert restarted.status_code == 200, restarted.text
    line = server.wait_for(f"message {message_id} restarted by ops from")
    assert "from 127.0.0.1 " in line and FORGED not in server.output
    statuses = _guesses(server, 8, forged=True)
    assert statuses[:5] == [401] * 5 and statuses[5:] == [429] * 3, statuses
    server.wait_for("login refused for user 'ops' from 127.0.0.1")
    assert "198.51.100." not in server.output
    assert server.stop() == 0


def test_a_proxy_named_in_forwarded_allow_ips_gives_the_client_address(tmp_path: Path, serve) -> None:
    """``[server] forwarded_allow_ips`` lists the TLS terminator (here the test, on 127.0.0.1): its
    ``X-Forwarded-For`` is the client's address, for the audit line and the login limit alike."""
    _configure(tmp_path, '''
        [server]
        forwarded_allow_ips = ["127.0.0.1"]
    ''')
    server = serve(["--config", "openroute.toml"], cwd=tmp_path)
    server.wait_for("serving")
    message_id = _failed_message(server)
    restarted = httpx.post(f"{server.base}/admin/messages/{message_id}/restart", json={}, auth=("ops", "ops-secret"),
                           headers={"X-Forwarded-For": FORGED}, timeout=10)
    assert restarted.status_code == 200, restarted.text
    assert f"from {FORGED} " in server.wait_for(f"message {message_id} restarted by ops from")
    assert _guesses(server, 8, forged=True) == [401] * 8  # each client its own count, as the proxy says
    assert server.stop() == 0


def test_a_forged_forwarded_from_an_untrusted_peer_changes_no_address(tmp_path: Path, serve) -> None:
    """RFC 7239's ``Forwarded`` is no way around the socket's address either: rotating ``for=`` values (IPv4, IPv6
    in brackets with a port, obfuscated) from a peer not named in ``forwarded_allow_ips`` still get 429 after 5."""
    _configure(tmp_path)
    server = serve(["--config", "openroute.toml"], cwd=tmp_path)
    server.wait_for("serving")
    message_id = _failed_message(server)
    line = _restarted_from(server, message_id, {"Forwarded": f'for="[2001:db8::66]:4711";proto=https, for={FORGED}'})
    assert "from 127.0.0.1 " in line
    statuses = _guesses(server, 4, forged=True, header="Forwarded", value="for=198.51.100.{n};proto=https")
    statuses += _guesses(server, 4, forged=True, header="Forwarded", value='for="[2001:db8::{n}]:80", for=_p{n}')
    assert statuses[:5] == [401] * 5 and statuses[5:] == [429] * 3, statuses
    server.wait_for("login refused for user 'ops' from 127.0.0.1")
    assert "198.51.100." not in server.output and "2001:db8" not in server.output and FORGED not in server.output
    assert server.stop() == 0


def test_a_named_proxy_s_forwarded_gives_the_client_address_and_wins_over_x_forwarded_for(
        tmp_path: Path, serve) -> None:
    """From a proxy named in ``forwarded_allow_ips``, ``Forwarded`` gives the client's address (the nearest hop
    that is not a named proxy, an IPv6 address in brackets with a port included) and wins over an
    ``X-Forwarded-For`` sent beside it; ``for=unknown`` is that client. A malformed ``Forwarded`` is ignored: the
    socket's address is kept (``X-Forwarded-For`` not read instead), never a 500."""
    _configure(tmp_path, '''
        [server]
        forwarded_allow_ips = ["127.0.0.1", "10.0.4.0/24"]
    ''')
    server = serve(["--config", "openroute.toml"], cwd=tmp_path)
    server.wait_for("serving")
    first, second, third = (_failed_message(server, f"c-pay-{n}") for n in range(3))
    through_two = {"Forwarded": f'for={FORGED}, for="[2001:db8::17]:4711";proto=https, for=10.0.4.7',
                   "X-Forwarded-For": "198.51.100.99"}
    assert "from 2001:db8::17 " in _restarted_from(server, first, through_two)
    assert "from unknown " in _restarted_from(server, second, {"Forwarded": "For=UNKNOWN"})
    assert "from 127.0.0.1 " in _restarted_from(server, third, {"Forwarded": "for=192.0.2.43:8080",  # unquoted
                                                               "X-Forwarded-For": "198.51.100.98"})
    assert "198.51.100.9" not in server.output and FORGED not in server.output
    # each client its own count, as the proxy says
    assert _guesses(server, 8, forged=True, header="Forwarded", value="for=192.0.2.{n}") == [401] * 8
    # malformed: every guess from the proxy's own address, whatever X-Forwarded-For says beside it
    with httpx.Client(base_url=server.base, timeout=10) as client:
        statuses = [client.get("/admin/counts", auth=("ops", f"bad-{n}"), headers=headers).status_code
                    for n, headers in enumerate([
                        {"Forwarded": 'for="[2001:db8::1"', "X-Forwarded-For": "198.51.100.1"},
                        {"Forwarded": "for=a;for=b"}, {"Forwarded": "for=[::1]"}, {"Forwarded": ","},
                        {"Forwarded": "for=192.0.2.1 x"}, {"Forwarded": 'for="\\"'}, {"Forwarded": "for=host.example"},
                    ])]
    assert statuses == [401] * 5 + [429] * 2, statuses
    server.wait_for("login refused for user 'ops' from 127.0.0.1")
    assert server.stop() == 0
    assert "Traceback" not in server.output


def _peak_kib(pid: int) -> int:
    """The process's peak resident memory (``VmHWM``) in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc")


def _stream_header(address: tuple[str, int], megabytes: int, answers: list[bytes]) -> None:
    """Send a request whose one header value would be ``megabytes`` long, until the server cuts it off; the answer
    read goes to ``answers``."""
    with socket.create_connection(address, timeout=20) as conn:
        conn.sendall(b"POST /api/shop/order HTTP/1.1\r\nHost: x\r\nX-Source-System: SHOP\r\nX-Big: ")
        chunk = b"a" * 65536
        try:
            for _ in range(megabytes * 16):
                conn.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        try:
            while data := conn.recv(65536):
                answer += data
        except (ConnectionResetError, TimeoutError):
            pass
        answers.append(answer)


def test_oversized_headers_are_refused_with_431_and_the_node_memory_stays_flat(tmp_path: Path, serve) -> None:
    """Eight connections at once each try to send a 40 MB header and one request has 200 headers: each gets 431
    and a closed connection, one WARNING line each, nothing is stored, and the node's peak memory grows by less
    than one such header (the limit, 64 KiB by default, is checked as the bytes arrive)."""
    _configure(tmp_path)
    server = serve(["--config", "openroute.toml"], cwd=tmp_path)
    server.wait_for("serving")
    assert httpx.get(f"{server.base}/health", timeout=10).status_code == 200
    before = _peak_kib(server.process.pid)
    host, port = server.base.removeprefix("http://").rsplit(":", 1)
    answers: list[bytes] = []
    threads = [threading.Thread(target=_stream_header, args=((host, int(port)), 40, answers)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    many = "".join(f"X-H{n}: v\r\n" for n in range(200)).encode()
    with socket.create_connection((host, int(port)), timeout=20) as conn:
        conn.sendall(b"POST /api/shop/order HTTP/1.1\r\nHost: x\r\nX-Source-System: SHOP\r\n" + many +
                     b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        answers.append(conn.recv(65536))
    grown = _peak_kib(server.process.pid) - before
    assert len(answers) == 9 and all(a.startswith(b"HTTP/1.1 431 ") for a in answers), [a[:60] for a in answers]
    assert b"HEADERS_TOO_LARGE" in answers[0] and b"more than 100 headers" in answers[-1]
    assert grown < 16 * 1024, f"the node grew by {grown} KiB"
    assert server.stop() == 0  # the rest of its output read
    refused = [line for line in server.lines if "refused with 431" in line]
    assert len(refused) == 9 and all("127.0.0.1:" in line and "connection closed" in line for line in refused)
    assert not [line for line in server.lines if "Traceback" in line or "Invalid HTTP request" in line]
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'store.db'}")
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM message")).scalar_one() == 0
    engine.dispose()
