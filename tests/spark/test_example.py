"""The example pipeline (examples/sensor_pipeline.py) runs end to end."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sensor_pipeline.py"


def test_sensor_pipeline_aggregates_every_complete_minute(
    spark: Any, sqlite_url: str, tmp_path: Path
) -> None:
    spec = importlib.util.spec_from_file_location("sensor_pipeline", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    rows = example.run(sqlite_url, 90, tmp_path)

    # 90 readings, one per 5 s over 3 devices: 7 complete minutes (the 8th is open).
    assert sorted((r["minute"], r["device"]) for r in rows) == sorted(
        (f"2026-01-01T00:0{m}Z", d) for m in range(7) for d in example.DEVICES
    )
    assert all(r["readings"] == 4 for r in rows)
    boiler = [r for r in rows if r["device"] == "boiler" and r["minute"].endswith("00Z")]
    assert boiler[0]["avg_temperature"] == pytest.approx((20 + 23 + 26 + 22) / 4)
