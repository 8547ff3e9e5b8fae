"""mosquitto_sub and mosquitto_pub (Debian's mosquitto-clients) against
`riverbed serve`: the interop feature list (`features.py`), MQTT 5 and 3.1.1.

The tools connect once per run, so one `InteropClient` is several runs:
`connect()` starts a `mosquitto_sub` that holds the connection (on a topic of
its own until the test subscribes: mosquitto_sub needs one), `subscribe()`
starts it again with the filter and the same options, `publish()` runs
`mosquitto_pub` (with the client id and ".pub": one id cannot have two
connections), `disconnect()` is SIGTERM (mosquitto_sub then sends DISCONNECT; MQTT 5: with
reason code 0x04, so the Will is published)
and `crash()` SIGKILL. `mosquitto_sub -d` (line-buffered by
`stdbuf`) prints the CONNACK's code and the SUBACK's; `-F %j` prints each
message as JSON. Session Present is not printed: `connect()` returns None.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from harness.waiting import DEFAULT_TIMEOUT, eventually
from interop.clients import Endpoint, MakeClient, Message, Refused
from interop.features import Features, after_disconnect_with_will
from interop.installed import require_command

VERSIONS = {5: "mqttv5", 4: "mqttv311"}

CONNACK = re.compile(r"received CONNACK \((\d+)\)")
SUBACK = re.compile(r"^Subscribed \(mid: \d+\): ([\d, ]+)$")


@dataclass(frozen=True, slots=True)
class Tools:
    mosquitto_sub: str
    mosquitto_pub: str
    stdbuf: str
    """coreutils' stdbuf: mosquitto_sub's output is line-buffered only on a terminal."""


@dataclass(frozen=True, slots=True)
class Options:
    clean: bool = True
    expiry: int | None = None
    will: tuple[str, str, int] | None = None
    credentials: tuple[str, str] | None = None
    tls: bool = False


class Subscriber:
    """One run of `mosquitto_sub -d -F %j`, its output read as it comes."""

    def __init__(self, command: list[str]) -> None:
        self.lines: list[str] = []
        self.messages: list[Message] = []
        self.reprinted = 0
        """JSON lines dropped as a second print of one already read."""
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        printed: set[str] = set()
        for line in self.process.stdout:
            line = line.rstrip("\n")
            with self._lock:
                if line.startswith("{"):
                    if line in printed:
                        # SIGTERM while mosquitto_sub prints a message can make it
                        # print the line again at exit: same "tst" to the
                        # microsecond and one "received PUBLISH" line (seen under
                        # load). A message delivered twice has a time of its own.
                        self.reprinted += 1
                        continue
                    printed.add(line)
                    event = json.loads(line)
                    self.messages.append(
                        Message(
                            event["topic"], event["payload"], event["qos"], bool(event["retain"])
                        )
                    )
                else:
                    self.lines.append(line)

    def output(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def received(self) -> list[Message]:
        with self._lock:
            return list(self.messages)

    def wait_line(self, pattern: re.Pattern[str], what: str) -> re.Match[str] | None:
        """The first output line matching `pattern`, once printed; None if the
        process exited without printing one."""

        def found() -> tuple[re.Match[str] | None] | None:
            for line in self.output():
                if match := pattern.search(line):
                    return (match,)
            if self.process.poll() is not None:
                self._reader.join(5)
                matches = [m for line in self.output() if (m := pattern.search(line))]
                return (matches[0] if matches else None,)
            return None

        (match,) = eventually(
            found, DEFAULT_TIMEOUT, what, explain=lambda: "\n".join(self.output()[-20:])
        )
        return match

    def stop(self, how: signal.Signals) -> int:
        if self.process.poll() is None:
            self.process.send_signal(how)
        code = self.process.wait(DEFAULT_TIMEOUT)
        self._reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code


class MosquittoClient:
    def __init__(self, tools: Tools, endpoint: Endpoint, client_id: str, version: int) -> None:
        self.tools = tools
        self.endpoint = endpoint
        self.client_id = client_id
        self.version = version
        self.options = Options()
        self.filters: list[tuple[str, int]] = []
        self.runs: list[Subscriber] = []
        """Every mosquitto_sub run so far; the last one may be running."""

    def _common(self, client_id: str) -> list[str]:
        o = self.options
        tls = o.tls
        args = ["-h", "127.0.0.1", "-p", str(self.endpoint.tls_port if tls else self.endpoint.port)]
        args += ["-V", VERSIONS[self.version], "-i", client_id]
        if tls:
            args += ["--cafile", str(self.endpoint.ca)]
        if o.credentials is not None:
            args += ["-u", o.credentials[0], "-P", o.credentials[1]]
        return args

    def _run(self) -> Subscriber:
        """mosquitto_sub with the options and filters (or a topic of its own)."""
        o = self.options
        command = [self.tools.stdbuf, "-oL", self.tools.mosquitto_sub, "-d", "-F", "%j"]
        command += self._common(self.client_id)
        if not o.clean:
            command.append("-c")  # clean session / clean start off
            if o.expiry is not None:
                command += ["-x", str(o.expiry)]
        if o.will is not None:
            topic, payload, qos = o.will
            command += ["--will-topic", topic, "--will-payload", payload, "--will-qos", str(qos)]
        filters = self.filters or [(f"interop-idle/{self.client_id}", 0)]
        assert len({qos for _, qos in filters}) == 1, "mosquitto_sub has one -q for all"
        command += ["-q", str(filters[0][1])]
        for topic_filter, _ in filters:
            command += ["-t", topic_filter]
        run = Subscriber(command)
        self.runs.append(run)
        connack = run.wait_line(CONNACK, f"the CONNACK of {self.client_id!r}")
        code = int(connack.group(1)) if connack else None
        if code != 0:
            run.stop(signal.SIGKILL)
            if code is None:
                raise AssertionError("mosquitto_sub failed:\n" + "\n".join(run.output()))
            raise Refused(code)
        return run

    def _running(self) -> Subscriber | None:
        if self.runs and self.runs[-1].process.poll() is None:
            return self.runs[-1]
        return None

    def connect(
        self,
        *,
        clean: bool = True,
        expiry: int | None = None,
        will: tuple[str, str, int] | None = None,
        credentials: tuple[str, str] | None = None,
        tls: bool = False,
    ) -> bool | None:
        assert self._running() is None, "already connected"
        self.options = Options(clean, expiry, will, credentials, tls)
        run = self._run()
        # Also for its topic of its own: mosquitto_sub exits (255) without a
        # DISCONNECT on SIGTERM until its CONNACK callback ran; the SUBACK is after.
        run.wait_line(SUBACK, f"the SUBACK of {self.client_id!r}")
        return None

    def subscribe(self, topic_filter: str, qos: int) -> list[int]:
        running = self._running()
        if running is not None:
            assert running.stop(signal.SIGTERM) == 0, running.output()
        self.filters.append((topic_filter, qos))
        run = self._run()
        suback = run.wait_line(SUBACK, f"the SUBACK of {self.client_id!r}")
        assert suback is not None, run.output()
        return [int(code) for code in suback.group(1).split(",")][-1:]

    def publish(self, topic: str, payload: str, qos: int, retain: bool = False) -> None:
        command = [self.tools.mosquitto_pub, *self._common(f"{self.client_id}.pub")]
        command += ["-t", topic, "-m", payload, "-q", str(qos), *(["-r"] if retain else [])]
        # It exits 0 once the publish is complete (PUBACK / PUBCOMP) and it disconnected.
        result = subprocess.run(command, capture_output=True, text=True, timeout=DEFAULT_TIMEOUT)
        assert result.returncode == 0, result.stdout + result.stderr

    def messages(self) -> list[Message]:
        return [m for run in self.runs for m in run.received()]

    def output(self) -> list[str]:
        """Every run's `-d` lines (the packets it sent and received)."""
        return [line for run in self.runs for line in run.output()]

    def disconnect(self) -> None:
        running = self._running()
        assert running is not None, "not connected"
        assert running.stop(signal.SIGTERM) == 0, running.output()

    def crash(self) -> None:
        running = self._running()
        assert running is not None, "not connected"
        running.stop(signal.SIGKILL)

    def close(self) -> None:
        running = self._running()
        if running is not None:
            running.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def tools() -> Tools:
    hint = "Debian: apt-get install mosquitto-clients"
    return Tools(
        require_command("mosquitto_sub", hint),
        require_command("mosquitto_pub", hint),
        require_command("stdbuf", "Debian: coreutils"),
    )


@pytest.fixture
def make_client(tools: Tools, endpoint: Endpoint, version: int) -> Iterator[MakeClient]:
    made: list[MosquittoClient] = []

    def make(client_id: str) -> MosquittoClient:
        made.append(MosquittoClient(tools, endpoint, client_id, version))
        return made[-1]

    yield make
    for client in made:
        client.close()


class TestMosquittoClients(Features):
    def test_will_not_fired_on_disconnect(
        self, make_client: MakeClient, names: str, version: int
    ) -> None:
        """On SIGTERM mosquitto_sub disconnects with MQTT 5's reason code 0x04,
        Disconnect with Will Message: the Will is published as it asks. MQTT
        3.1.1 has no such code: a DISCONNECT discards the Will."""
        expected = ["gone", "marker"] if version == 5 else ["marker"]
        clients: list[MosquittoClient] = []

        def tracked(client_id: str) -> MosquittoClient:
            client = make_client(client_id)
            assert isinstance(client, MosquittoClient)
            clients.append(client)
            return client

        got = after_disconnect_with_will(tracked, names)
        # Each client's debug lines (packets with their DUP flags and ids) if not.
        assert got == expected, {c.client_id: c.output() for c in clients}


def test_a_line_printed_twice_is_one_message() -> None:
    """A JSON line read again (same receipt time to the microsecond) is the
    same print; a second delivery of the message has a time of its own."""
    line = '{"tst":"2026-11-29T13:05:51.801741Z+0000","topic":"t","qos":1,"retain":0,"payload":"m"}'
    again = line.replace("801741", "803002")
    run = Subscriber(["printf", "%s\\n", line, "Client c sending DISCONNECT", line, again])
    assert run.process.wait(DEFAULT_TIMEOUT) == 0
    run.stop(signal.SIGTERM)  # exited: reads the rest and closes
    assert [m.payload for m in run.received()] == ["m", "m"]
    assert run.reprinted == 1
