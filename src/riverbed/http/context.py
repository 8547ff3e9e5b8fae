"""What the admin app serves (`HttpContext`) and the configuration it shows.

    context = HttpContext(log, node="n1", settings=config_view(config), broker=broker)

Every route module (`topics`, `subscriptions`, `clients`, ...) takes the one
context `app.make_app` was given; none keeps state of its own.
"""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from riverbed.http.jobs import Jobs
from riverbed.mqtt.config import Address
from riverbed.storage.urls import redact_url

if TYPE_CHECKING:
    from riverbed.http.auth import TokenFile
    from riverbed.log.log import Log
    from riverbed.mqtt.broker import Broker


@dataclass(frozen=True, slots=True)
class HttpContext:
    """What the app serves: the log, this node, the settings in force, and the
    broker beside it (None under `riverbed admin`)."""

    log: Log
    node: str
    settings: dict[str, Any]
    """The configuration in force, secrets hidden (`config_view`)."""
    tokens: TokenFile | None = None
    """None: no token file, every request is an admin's (loopback only)."""
    broker: Broker | None = None
    listening: Callable[[], bool] = lambda: True
    """Whether every listener of the process is bound (for `/readyz`)."""
    started: float = field(default_factory=time.time)
    jobs: Jobs = field(default_factory=Jobs)
    """The long operations started over the API (`http.jobs`), in this process."""


def config_view(config: object) -> Any:
    """A configuration dataclass as JSON-ready values: addresses and paths as
    text, the database URL without its password."""
    if isinstance(config, Address | Path):
        return str(config)
    if is_dataclass(config) and not isinstance(config, type):
        view = {f.name: config_view(getattr(config, f.name)) for f in fields(config)}
        url = view.get("url")
        if isinstance(url, str):
            view["url"] = redact_url(url)
        return view
    return config


def version() -> str:
    """The installed package's version ("unknown" from a bare source tree)."""
    try:
        return importlib.metadata.version("riverbed")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
