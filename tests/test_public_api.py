"""The public front: `riverbed` exports what users need, lazily."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import riverbed
from riverbed import errors


@pytest.mark.parametrize("name", riverbed.__all__)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(riverbed, name) is not None
    assert name in dir(riverbed)


def test_every_exception_of_errors_is_public_and_a_riverbed_error() -> None:
    declared = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value)
        and issubclass(value, Exception)
        and value.__module__ == errors.__name__
    }
    assert declared <= set(riverbed.__all__)
    for name in declared:
        assert issubclass(getattr(riverbed, name), riverbed.RiverbedError)


def test_names_are_the_defining_modules_objects() -> None:
    from riverbed.log.log import Log
    from riverbed.subscriptions.workers import Worker

    assert riverbed.Log is Log
    assert riverbed.Worker is Worker


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="'Nope'"):
        riverbed.Nope  # noqa: B018


def test_importing_riverbed_loads_no_storage_or_log() -> None:
    """`import riverbed` stays cheap: the command line imports it first."""
    code = "import sys, riverbed; print(sorted(m for m in sys.modules if m.startswith('riverbed')))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "['riverbed', 'riverbed.errors']", out
