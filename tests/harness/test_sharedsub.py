"""The shortened shared-subscription timers are a configuration the broker takes."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from harness.sharedsub import short_timers_config
from riverbed.mqtt.config import load_config
from riverbed.sharedsub.config import SharedSubConfig


def test_every_timer_is_set_and_shorter_than_its_default(tmp_path: Path) -> None:
    # As a broker started by the harness reads it (which allows anonymous clients).
    loaded = load_config(short_timers_config(tmp_path), {"auth.allow_anonymous": True})
    timers = loaded.shared_subscriptions.timers
    default = SharedSubConfig()
    for timer in fields(SharedSubConfig):
        shortened, usual = getattr(timers, timer.name), getattr(default, timer.name)
        # fence_margin's default is short already.
        assert shortened < usual or timer.name == "fence_margin", (timer.name, shortened)


def test_a_timer_may_be_set_apart(tmp_path: Path) -> None:
    loaded = load_config(
        short_timers_config(tmp_path, leader_idle_stop=30.0), {"auth.allow_anonymous": True}
    )
    assert loaded.shared_subscriptions.timers.leader_idle_stop == 30.0
    assert loaded.shared_subscriptions.timers.leader_periodic == 0.5
