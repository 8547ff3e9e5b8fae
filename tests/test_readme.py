"""The README's Python API example runs, and runs again on the same database
(it reuses its topic and subscription). The code is taken from README.md
itself, so the test follows the README."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_api_example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Python API") :]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None, "README.md has no Python block under ## Python API"
    return found.group(1)


def test_the_python_api_example_runs_twice(tmp_path: Path) -> None:
    code = python_api_example()
    assert "exist_ok=True" in code
    for run in (1, 2):
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, (run, done.stderr)
        # The first run commits what it read: the second reads its own "hello".
        printed = [line for line in done.stdout.splitlines() if line.endswith("b'hello'")]
        assert len(printed) == 1, (run, done.stdout)
    assert (tmp_path / "riverbed-data" / "riverbed.db").exists()
