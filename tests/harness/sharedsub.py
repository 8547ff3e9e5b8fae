"""Shared subscriptions with their protocol's timers shortened, so that a test
(or `bench/chaos.py`) sees a group find its Leader and a member's streams move
within seconds instead of the defaults' tens of seconds.

    with BrokerProcess(url, extra_args=("--config", str(short_timers_config(tmp_path)))):
        ...

The defaults themselves are checked in `tests/sharedsub/test_config.py`.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from riverbed.sharedsub.config import SharedSubConfig

SHORT_TIMERS = """
[shared_subscriptions]
find_leader_retry = 0.3
ping_interval = 1.0
ping_timeout = 1.0
unsubscribe_timeout = 0.5
leader_borrower_timeout = 2.0
fence_margin = 0.5
leader_periodic = 0.5
leader_resend = 0.5
leader_claim_lease = 6.0
leader_idle_stop = 5.0
"""
"""The `[shared_subscriptions]` section of a configuration file, timers shortened."""


def short_timers_config(directory: Path, **timers: float) -> Path:
    """Write `riverbed.toml` with `SHORT_TIMERS` in `directory`, any of them
    replaced by `timers` (`leader_idle_stop=30.0`); its path, for a broker's
    `--config`."""
    text = SHORT_TIMERS
    for name, seconds in timers.items():
        text, found = re.subn(rf"(?m)^{name} = .*$", f"{name} = {seconds}", text)
        assert found == 1, f"no timer {name!r} in SHORT_TIMERS"
    path = directory / "riverbed.toml"
    path.write_text(text)
    return path


def short_timers() -> SharedSubConfig:
    """`SHORT_TIMERS` as the timers object (for a broker started in process)."""
    return SharedSubConfig(**tomllib.loads(SHORT_TIMERS)["shared_subscriptions"])
