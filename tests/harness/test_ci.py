"""The CI strictness hooks (`harness/ci.py`), run on small test directories
with `pytester`: in CI a backend's tests may not skip, neither while running nor
while their module is collected."""

from __future__ import annotations

import pytest

CONFTEST = """
import pytest
from harness.ci import pytest_make_collect_report, pytest_runtest_makereport

def pytest_configure(config):
    config.addinivalue_line("markers", "postgres: needs PostgreSQL")
"""

MODULES = {
    # Skipped at import: the module name says which backend.
    "test_postgres_things": "import pytest\npytest.importorskip('no_such_module_x')\n"
    "def test_one(): pass\n",
    # Skipped at import: the reason says which backend.
    "test_source": "import pytest\npytest.importorskip('pyspark_is_not_here')\n"
    "def test_one(): pass\n",
    # A skip at run time of a marked test.
    "test_marked": "import pytest\n@pytest.mark.postgres\n"
    "def test_one(): pytest.skip('no server')\n",
    # Skips that have nothing to do with a backend stay skips.
    "test_windows": "import pytest\npytest.skip('not on this OS', allow_module_level=True)\n",
    "test_unmarked": "import pytest\ndef test_one(): pytest.skip('not today')\n",
}


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(**MODULES)
    return pytester


def test_outside_ci_every_skip_is_a_skip(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)

    result = suite.runpytest("-p", "no:cacheprovider", "-rs")

    result.assert_outcomes(skipped=5)


def test_in_ci_backend_skips_fail_at_collection_and_at_run_time(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")

    result = suite.runpytest("-p", "no:cacheprovider", "--continue-on-collection-errors")

    result.assert_outcomes(errors=2, failed=1, skipped=2)
    for expected in (
        "*test_postgres_things.py was skipped while being collected in CI,"
        " where tests of postgres must run*",
        "*test_source.py was skipped while being collected in CI,"
        " where tests of spark/pyspark must run: *pyspark_is_not_here*",
        "*a test marked postgres was skipped in CI, where it must run: *no server*",
    ):
        result.stdout.fnmatch_lines([expected])
    assert result.ret != 0
