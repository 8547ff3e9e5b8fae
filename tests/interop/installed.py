"""What to do when an interop client is not installed: skip its tests locally,
fail them in CI (`CI=true`), as for a backend (`harness/ci.py`): a skip there
would hide that a whole client went untested."""

from __future__ import annotations

import shutil

import pytest

from harness.ci import in_ci


def missing(what: str, hint: str) -> None:
    """`what` is not installed: skip the test, or fail it in CI."""
    message = f"{what} is not installed ({hint})"
    if in_ci():
        pytest.fail(f"{message}; in CI every interop client must run", pytrace=False)
    pytest.skip(message)


def require_command(name: str, hint: str) -> str:
    """The path of the command `name`, or skip (fail in CI) without it."""
    path = shutil.which(name)
    if path is None:
        missing(f"the command {name!r}", hint)
    assert path is not None
    return path
