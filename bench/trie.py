"""Topic trie benchmark: `TopicTrie.match` beside a scan of every filter.

The broker routes each committed message through the trie to the online
sessions it matches (DESIGN.md, "Sessions"). This measures topic names matched
per second against 10,000 subscriptions (`--filters`) in two workloads:

- mixed: an IoT-shaped set, 70% filters without wildcards
  (`site/S/device/D/telemetry`), 20% with `+` (`site/S/device/+/alarm`,
  `site/+/device/D/cmd`), 10% with `#` (`site/S/#`, `site/S/device/D/#`);
- wildcard: the same shapes, every filter with a `+` or a `#`, so every match
  walks the trie.

Names are drawn from the same space (`site/S/device/D/KIND`, some `$SYS/...`).
The peer is the scan a broker without a trie does: `matches(filter, name)` for
every filter. Both return the same subscribers (checked on a sample); the scan
is timed on fewer names because it is slow.

    .venv/bin/python bench/trie.py [--filters N] [--names N] [--seed N]
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import time
from collections import Counter
from collections.abc import Callable

from riverbed.topics.filters import matches
from riverbed.topics.trie import TopicTrie

KINDS = ["telemetry", "alarm", "cmd", "status", "config"]
ROUNDS = 3


def make_filters(count: int, rng: random.Random, wildcard_only: bool) -> list[str]:
    sites, devices = max(1, count // 200), 100
    out: list[str] = []
    while len(out) < count:
        s, d, kind = rng.randrange(sites), rng.randrange(devices), rng.choice(KINDS)
        roll = rng.random() if not wildcard_only else 0.7 + 0.3 * rng.random()
        if roll < 0.7:
            out.append(f"site/{s}/device/{d}/{kind}")
        elif roll < 0.8:
            out.append(f"site/{s}/device/+/{kind}")
        elif roll < 0.9:
            out.append(f"site/+/device/{d}/{kind}")
        elif roll < 0.95:
            out.append(f"site/{s}/#")
        else:
            out.append(f"site/{s}/device/{d}/#")
    return out


def make_names(count: int, filters: int, rng: random.Random) -> list[str]:
    sites = max(1, filters // 200)
    names = [
        f"site/{rng.randrange(sites)}/device/{rng.randrange(100)}/{rng.choice(KINDS)}"
        for _ in range(count)
    ]
    for index in range(0, count, 50):
        names[index] = "$SYS/broker/load"  # not matched by leading wildcards
    return names


def best_rate(run: Callable[[], int], count: int) -> tuple[float, int]:
    """Names per second of the fastest of ROUNDS runs, and matches found."""
    best, found = float("inf"), 0
    for _ in range(ROUNDS):
        started = time.perf_counter()
        found = run()
        best = min(best, time.perf_counter() - started)
    return count / best, found


def workload(label: str, filters: list[str], names: list[str], scan_names: int) -> None:
    trie: TopicTrie[int] = TopicTrie()
    started = time.perf_counter()
    for subscriber, topic_filter in enumerate(filters):
        trie.add(topic_filter, subscriber)
    build = time.perf_counter() - started

    def run_trie() -> int:
        match = trie.match
        return sum(len(match(name)) for name in names)

    pairs = list(enumerate(filters))
    sample = names[:scan_names]

    def run_scan() -> int:
        return sum(1 for name in sample for _, f in pairs if matches(f, name))

    for name in sample[:200]:
        expected = Counter(s for s, f in pairs if matches(f, name))
        assert Counter(trie.match(name)) == expected, name

    trie_rate, trie_found = best_rate(run_trie, len(names))
    scan_rate, _ = best_rate(run_scan, len(sample))
    print(
        f"{label:9} {len(filters):>8,} {trie.node_count():>7,} {build * 1e3:>9.1f}"
        f" {trie_rate:>13,.0f} {scan_rate:>11,.0f} {trie_rate / scan_rate:>8,.0f}"
        f" {trie_found / len(names):>8.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filters", type=int, default=10_000)
    parser.add_argument("--names", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(f"# python {platform.python_version()} on {platform.machine()}; best of {ROUNDS}")
    print(
        f"{'workload':9} {'filters':>8} {'nodes':>7} {'build ms':>9} {'trie names/s':>13}"
        f" {'scan names/s':>11} {'ratio':>8} {'hits/name':>8}"
    )
    gc.collect()
    for label, wildcard_only in (("mixed", False), ("wildcard", True)):
        rng = random.Random(args.seed)
        filters = make_filters(args.filters, rng, wildcard_only)
        names = make_names(args.names, args.filters, rng)
        workload(label, filters, names, scan_names=max(50, 2_000_000 // args.filters))


if __name__ == "__main__":
    main()
