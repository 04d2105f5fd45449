"""``openroute run`` against hostile clients, in a real process: a forged ``X-Forwarded-For`` changes no address
unless ``[server] forwarded_allow_ips`` names the peer, and oversized headers are refused with 431 while the
node's memory stays flat."""

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


def _failed_message(server: Server) -> int:
    """A message that ended FAILED (the route ``shop/pay`` always fails), by id."""
    headers = {"X-Source-System": "SHOP", "X-Correlation-Id": "c-pay"}
    accepted = httpx.post(f"{server.base}/api/shop/pay", json={"n": 1}, headers=headers, timeout=10)
    assert accepted.status_code == 202, accepted.text
    server.wait_for("PROCESSING -> FAILED")
    return int(accepted.json()["messageId"])


def _guesses(server: Server, count: int, forged: bool) -> list[int]:
    """The statuses of ``count`` wrong passwords of ``ops``, each claiming another address when ``forged``."""
    statuses = []
    with httpx.Client(base_url=server.base, timeout=10) as client:
        for n in range(count):
            headers = {"X-Forwarded-For": f"198.51.100.{n + 1}"} if forged else {}
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
