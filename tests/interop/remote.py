"""A client in a driver process, spoken to one JSON object a line.

The aiomqtt driver (`aiomqtt_client.py`) and the MQTT.js one (`js/client.js`)
speak the same language: commands on stdin, events on stdout.

    {"op": "connect", "port", "clientId", "version", "clean", "expiry",
     "username", "password", "ca", "will": {"topic", "payload", "qos"} | null}
                          -> {"event": "connack", "sessionPresent"}
                             | {"event": "refused", "code"}
    {"op": "subscribe", "filter", "qos"}            -> {"event": "suback", "codes"}
    {"op": "publish", "topic", "payload", "qos", "retain"} -> {"event": "published"}
    {"op": "disconnect"}                            -> {"event": "disconnected"}
    at any time: {"event": "message", "topic", "payload", "qos", "retain"}
    on failure: {"event": "error", "message"}

`RemoteClient` is an `InteropClient` over such a process: it sends a command
and waits for its answer; messages are collected as they come. `crash()` kills
the process (SIGKILL), so its connection closes without a DISCONNECT; the next
`connect()` starts a new one.
"""

from __future__ import annotations

import json
import queue
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from harness.waiting import DEFAULT_TIMEOUT
from interop.clients import Endpoint, MakeClient, Message, Refused


class RemoteClient:
    def __init__(
        self, command: list[str], endpoint: Endpoint, client_id: str, version: int
    ) -> None:
        self.command = command
        self.endpoint = endpoint
        self.client_id = client_id
        self.version = version
        self.process: subprocess.Popen[str] | None = None
        self._answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self._messages: list[Message] = []
        self._lock = threading.Lock()
        self._stderr: IO[str] | None = None

    # --- the process --------------------------------------------------------------------
    def _start(self) -> subprocess.Popen[str]:
        if self.process is not None and self.process.poll() is None:
            return self.process
        # Kept open while the process runs: failures quote it.
        self._stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self.process = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        # Each process its own queue: a killed one's last words stay out of the next's.
        self._answers = queue.Queue()
        reader = threading.Thread(target=self._read, args=(self.process, self._answers))
        reader.daemon = True
        reader.start()
        return self.process

    def _read(self, process: subprocess.Popen[str], answers: queue.Queue[dict[str, Any]]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            event = json.loads(line)
            if event["event"] == "message":
                message = Message(event["topic"], event["payload"], event["qos"], event["retain"])
                with self._lock:
                    self._messages.append(message)
            else:
                answers.put(event)
        answers.put({"event": "exited"})

    def _ask(self, command: dict[str, Any], *expected: str) -> dict[str, Any]:
        process = self._start()
        assert process.stdin is not None
        process.stdin.write(json.dumps(command) + "\n")
        process.stdin.flush()
        try:
            answer = self._answers.get(timeout=DEFAULT_TIMEOUT)
        except queue.Empty:
            raise AssertionError(
                f"{self.client_id}: no answer to {command['op']} within {DEFAULT_TIMEOUT}s"
                f"{self._diagnostics()}"
            ) from None
        if answer["event"] not in expected:
            raise AssertionError(
                f"{self.client_id}: {command['op']} answered {answer}{self._diagnostics()}"
            )
        return answer

    def _diagnostics(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        text = self._stderr.read()[-3000:]
        return f"\nthe driver's stderr:\n{text}" if text else ""

    # --- InteropClient ------------------------------------------------------------------
    def connect(
        self,
        *,
        clean: bool = True,
        expiry: int | None = None,
        will: tuple[str, str, int] | None = None,
        credentials: tuple[str, str] | None = None,
        tls: bool = False,
    ) -> bool | None:
        username, password = credentials or (None, None)
        answer = self._ask(
            {
                "op": "connect",
                "port": self.endpoint.tls_port if tls else self.endpoint.port,
                "clientId": self.client_id,
                "version": self.version,
                "clean": clean,
                "expiry": expiry,
                "username": username,
                "password": password,
                "ca": str(self.endpoint.ca) if tls else None,
                "will": None
                if will is None
                else {"topic": will[0], "payload": will[1], "qos": will[2]},
            },
            "connack",
            "refused",
        )
        if answer["event"] == "refused":
            self.close()
            raise Refused(answer["code"])
        return bool(answer["sessionPresent"])

    def subscribe(self, topic_filter: str, qos: int) -> list[int]:
        answer = self._ask({"op": "subscribe", "filter": topic_filter, "qos": qos}, "suback")
        return [int(code) for code in answer["codes"]]

    def publish(self, topic: str, payload: str, qos: int, retain: bool = False) -> None:
        command = {"op": "publish", "topic": topic, "payload": payload, "qos": qos}
        self._ask({**command, "retain": retain}, "published")

    def messages(self) -> list[Message]:
        with self._lock:
            return list(self._messages)

    def disconnect(self) -> None:
        self._ask({"op": "disconnect"}, "disconnected")
        self.close()

    def crash(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()

    def close(self) -> None:
        """End the driver: stdin closed (it exits), killed if it lingers."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


JS_DRIVER = Path(__file__).parent / "js" / "client.js"
AIOMQTT_DRIVER = Path(__file__).parent / "aiomqtt_client.py"


def remote_clients(driver: list[str], endpoint: Endpoint, version: int) -> Iterator[MakeClient]:
    """A `make_client` fixture's body for a driver process per client: makes
    them on demand, closes them all after the test."""
    made: list[RemoteClient] = []

    def make(client_id: str) -> RemoteClient:
        made.append(RemoteClient(driver, endpoint, client_id, version))
        return made[-1]

    yield make
    for client in made:
        client.close()
