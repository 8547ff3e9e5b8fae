"""`riverbed serve` with broker timings a test chooses (they are no settings):

    python tests/harness/node.py --expiry-sweep 600 --node-lease-ttl 3 serve --mqtt ...

Each `--NAME VALUE` before the command is passed to `Broker` as `NAME=VALUE`
(`riverbed.mqtt.broker.serve`'s options); the rest is the `riverbed` command
line. `NodeProcess` starts a broker this way.

`--sweep-delay SECONDS` is the one that is not a `Broker` timing: each expiry
sweep's look at the sessions (`SessionStore.expire`) takes that much longer, as
it does with very many sessions, and logs `slow expiry sweep done` after it.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from typing import Any

from riverbed.mqtt import broker
from riverbed.sessions.store import SessionStore


def slow_expiry(delay: float) -> None:
    """Make every `SessionStore.expire` take `delay` seconds more."""
    expire = SessionStore.expire

    def slow(self: SessionStore, *args: Any, **kwargs: Any) -> list[str]:
        time.sleep(delay)
        gone = expire(self, *args, **kwargs)
        logging.getLogger("harness.node").warning("slow expiry sweep done")
        return gone

    SessionStore.expire = slow  # type: ignore[method-assign]


def main() -> None:
    args = sys.argv[1:]
    options: dict[str, float] = {}
    while args and args[0].startswith("--"):
        options[args[0][2:].replace("-", "_")] = float(args[1])
        args = args[2:]
    delay = options.pop("sweep_delay", None)
    if delay is not None:
        slow_expiry(delay)
    broker.serve = functools.partial(broker.serve, **options)  # type: ignore[assignment]
    sys.argv = ["riverbed", *args]
    from riverbed.cli import main as riverbed

    riverbed()


if __name__ == "__main__":
    main()
