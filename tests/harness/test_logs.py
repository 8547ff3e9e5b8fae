"""The failing test's report shows its brokers' logs (`harness/logs.py`), run
on a small test directory with `pytester`; a passing test's shows none."""

from __future__ import annotations

import pytest

CONFTEST = 'pytest_plugins = ["harness.logs"]\n'

MODULE = """
import pytest
from harness.broker import BrokerProcess

@pytest.fixture
def broker():
    broker = BrokerProcess("sqlite:///riverbed.db")
    broker.log_path.write_text("a line before\\nclient member: closing for a reason\\n")
    with broker:
        yield broker

def test_fails(broker):
    assert False, "paho's reasons: [128]"

def test_passes(broker):
    pass
"""


def test_a_failure_shows_the_tail_of_each_live_brokers_log(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_brokers=MODULE)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_fails _*",
            "*broker on port * (pid *, running): its log's tail*",
            "*closing for a reason*",
        ]
    )
    assert "test_passes" not in result.stdout.str()
