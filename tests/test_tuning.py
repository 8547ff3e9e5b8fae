"""Riverbed's process tuning."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from riverbed.tuning import GC_GEN0_THRESHOLD, tune_process


@pytest.fixture
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*before)


def test_tune_process_raises_only_the_young_threshold(restore_gc: None) -> None:
    gc.set_threshold(700, 11, 12)
    tune_process()
    assert gc.get_threshold() == (GC_GEN0_THRESHOLD, 11, 12)
    tune_process()  # idempotent
    assert gc.get_threshold() == (GC_GEN0_THRESHOLD, 11, 12)


def test_importing_riverbed_changes_nothing(restore_gc: None) -> None:
    import subprocess
    import sys

    code = "import gc, riverbed.cli, riverbed.log.log; print(gc.get_threshold()[0])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "700"
