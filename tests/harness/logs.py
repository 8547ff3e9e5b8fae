"""A failing test's report shows the tail of each broker's log that is still on
disk (`harness.broker.LIVE`): the broker started by the test or its fixtures,
whose teardown has not run yet. A CI run keeps nothing but its output, and
what a client saw (paho's "128") rarely says why the broker closed on it.

Enabled by a conftest's `pytest_plugins`.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from harness.broker import LIVE, BrokerProcess

TAIL_LINES = 40


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and report.when in ("setup", "call"):
        for broker in sorted(LIVE, key=lambda b: b.port):
            tail = broker.tail(TAIL_LINES)
            if tail:
                title = f"broker on port {broker.port} ({_state(broker)}): its log's tail"
                report.sections.append((title, tail))
    return report


def _state(broker: BrokerProcess) -> str:
    """Whether the broker's process runs, or how it ended (a process killed
    from outside leaves a log that just stops)."""
    process = broker.process
    if process is None:
        return "never started"
    code = process.poll()
    return f"pid {process.pid}, running" if code is None else f"pid {process.pid}, exited {code}"
