"""Two brokers on one PostgreSQL: a message committed on one reaches a
subscriber on the other because the commit wakes it (LISTEN/NOTIFY), not
because it polls; the poll (`[storage] poll_interval_ms`) delivers while the
LISTEN connection is down."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from harness.broker import BrokerProcess, Client
from harness.postgres import PostgresServer
from harness.waiting import SLOW, eventually
from riverbed.storage.postgres import LISTENER_NAME

pytestmark = pytest.mark.postgres

LONG_POLL_MS = 60_000
"""A poll that never delivers within a test."""
PROMPT = 10.0 * SLOW
"""A delivery woken by the commit arrives within this (a sixth of the long poll)."""

_roles = itertools.count()


def config(tmp_path: Path, poll_ms: int) -> Path:
    path = tmp_path / f"poll-{poll_ms}.toml"
    path.write_text(f"[storage]\npoll_interval_ms = {poll_ms}\n")
    return path


def node(url: str, conf: Path) -> BrokerProcess:
    return BrokerProcess(url, extra_args=("--config", str(conf)))


def subscriber(broker: BrokerProcess, client_id: str) -> Client:
    client = Client(broker.port, client_id)
    client.connect()
    assert client.subscribe("wake/#", qos=1) == [1]
    return client


def test_a_commit_on_one_node_wakes_a_subscriber_on_the_other(
    postgres_url: str, tmp_path: Path
) -> None:
    conf = config(tmp_path, LONG_POLL_MS)
    with node(postgres_url, conf) as a, node(postgres_url, conf) as b:
        sub = subscriber(b, "sub")
        pub = Client(a.port, "pub")
        pub.connect()
        # Several in turn: after each delivery the fan-out on B rests for the
        # poll; only the next commit's NOTIFY ends the rest.
        for n in range(5):
            payload = b"%d" % n
            sent = time.monotonic()
            pub.publish(f"wake/{n}", payload).wait_for_publish(PROMPT)
            (received,) = [
                m
                for m in sub.wait_payloads(payload, timeout=LONG_POLL_MS / 1000)
                if m.payload == payload
            ]
            assert received.at - sent < PROMPT, f"message {n} took {received.at - sent:.1f} s"
        pub.close()
        sub.close()


@pytest.fixture
def role(postgres_server: PostgresServer, postgres_url: str) -> Iterator[str]:
    """A login role of its own for one broker (so its new connections can be
    refused alone); the URL of `postgres_url`'s database as that role."""
    name = f"riverbed_node_{next(_roles)}_{time.monotonic_ns() % 1_000_000}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {name} LOGIN SUPERUSER")
    yield postgres_url.replace("postgresql://postgres@", f"postgresql://{name}@")
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"ALTER ROLE {name} NOLOGIN")
        admin.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = %s",
            (name,),
        )
        admin.execute(f"DROP OWNED BY {name}")
        admin.execute(f"DROP ROLE {name}")


def listeners(admin: psycopg.Connection[tuple[object, ...]], role: str) -> list[int]:
    rows = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE usename = %s AND application_name = %s",
        (role, LISTENER_NAME),
    ).fetchall()
    return [int(pid) for (pid,) in rows]


def test_the_poll_delivers_while_the_listen_connection_is_down(
    postgres_url: str, role: str, tmp_path: Path
) -> None:
    name = role.split("://")[1].split("@")[0]
    conf = config(tmp_path, 300)
    with (
        psycopg.connect(postgres_url, autocommit=True) as admin,
        node(postgres_url, conf) as a,
        node(role, conf) as b,
    ):
        sub = subscriber(b, "sub")
        pub = Client(a.port, "pub")
        pub.connect()
        pub.publish("wake/before", b"before").wait_for_publish(PROMPT)
        sub.wait_payloads(b"before")
        (listening,) = eventually(lambda: listeners(admin, name), what="B's LISTEN connection")

        # B's LISTEN connection breaks and cannot come back: its role may not
        # log in now (its other connections stay).
        admin.execute(f"ALTER ROLE {name} NOLOGIN")
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", (listening,))
        eventually(lambda: not listeners(admin, name), what="B's LISTEN connection to go")
        for n in range(3):
            payload = b"polled %d" % n
            pub.publish("wake/polled", payload).wait_for_publish(PROMPT)
            sub.wait_payloads(payload)
        assert not listeners(admin, name)  # they came through the poll

        # It listens again once it may connect.
        admin.execute(f"ALTER ROLE {name} LOGIN")
        eventually(lambda: listeners(admin, name), what="B's LISTEN connection again")
        pub.publish("wake/after", b"after").wait_for_publish(PROMPT)
        sub.wait_payloads(b"after")
        pub.close()
        sub.close()
