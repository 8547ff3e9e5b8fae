"""`--metrics [HOST:]PORT` of the commands that are not a broker (`riverbed
worker`, `riverbed subscription run`): their own Prometheus `/metrics`
(`riverbed.metrics.Exposition`; docs/metrics.md), off unless asked for.

A port alone listens on 127.0.0.1 (this machine only, like every default
address of Riverbed); the endpoint has no token, so give another host only
where the network around it is trusted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import click
from prometheus_client.metrics_core import Metric

from riverbed.errors import InvalidConfig
from riverbed.metrics import Exposition
from riverbed.mqtt.config import Address

METRICS_OPTION_HELP = (
    "Serve Prometheus metrics at http://HOST:PORT/metrics (a port alone: 127.0.0.1:PORT)."
    " Off by default."
)


def metrics_address(text: str) -> Address:
    """`HOST:PORT` or `PORT` (on 127.0.0.1); `click.BadParameter` naming the rule."""
    given = f"127.0.0.1:{text}" if text.isascii() and text.isdigit() else text
    try:
        return Address.parse(given)
    except InvalidConfig as exc:
        raise click.BadParameter(
            f"{exc} (give PORT or HOST:PORT, e.g. 9464 or 127.0.0.1:9464)",
            param_hint="'--metrics'",
        ) from None


def serve_metrics(address: Address, collect: Callable[[], Iterable[Metric]]) -> Exposition:
    """Listen on `address` and say where on stderr; a refusal to listen is
    `click.ClickException` (exit 1) before anything else has started."""
    try:
        exposition = Exposition(address.host, address.port, collect)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise click.ClickException(
            f"cannot serve metrics on {address}: {reason.lower()} (choose another --metrics"
            " address)"
        ) from None
    shown = Address(address.host, exposition.port)
    click.echo(f"metrics on http://{shown}/metrics", err=True)
    return exposition
