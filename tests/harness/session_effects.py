"""Reading a session's effects in tests (`riverbed.sessions.session`)."""

from __future__ import annotations

from collections.abc import Sequence

from riverbed.sessions.session import Effect, Fetch, FetchMany


def fetches(effects: Sequence[Effect]) -> list[Fetch]:
    """The fetches among `effects`, each stream of a `FetchMany` as a `Fetch`
    of its own, in the order they were asked for."""
    out: list[Fetch] = []
    for effect in effects:
        if isinstance(effect, Fetch):
            out.append(effect)
        elif isinstance(effect, FetchMany):
            out.extend(Fetch(key, offset, effect.limit) for key, offset in effect.positions.items())
    return out
