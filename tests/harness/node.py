"""`riverbed serve` with broker timings a test chooses (they are no settings):

    python tests/harness/node.py --expiry-sweep 600 --node-lease-ttl 3 serve --mqtt ...

Each `--NAME VALUE` before the command is passed to `Broker` as `NAME=VALUE`
(`riverbed.mqtt.broker.serve`'s options); the rest is the `riverbed` command
line. `NodeProcess` starts a broker this way.
"""

from __future__ import annotations

import functools
import sys

from riverbed.mqtt import broker


def main() -> None:
    args = sys.argv[1:]
    options: dict[str, float] = {}
    while args and args[0].startswith("--"):
        options[args[0][2:].replace("-", "_")] = float(args[1])
        args = args[2:]
    broker.serve = functools.partial(broker.serve, **options)  # type: ignore[assignment]
    sys.argv = ["riverbed", *args]
    from riverbed.cli import main as riverbed

    riverbed()


if __name__ == "__main__":
    main()
