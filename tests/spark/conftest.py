"""One SparkSession for the whole test session (5-11 s to start, ~1.3 GB).

Tests that use `spark` are marked `spark` automatically; locally they skip when
PySpark or a JVM is missing, in CI they fail instead (`harness/ci.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from harness.ci import in_ci

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'riverbed[spark]')")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if (
            "spark" in getattr(item, "fixturenames", ())
            and item.get_closest_marker("spark") is None
        ):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The session's SparkSession (`riverbed.spark.session()`), stopped at the end."""
    from riverbed.spark import session

    try:
        started = session()
    except Exception as exc:  # no JVM, or it would not start
        message = f"Spark could not start: {exc}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    started.sparkContext.setLogLevel("ERROR")
    try:
        yield started
    finally:
        started.stop()
