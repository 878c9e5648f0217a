"""Panel tests never write to the working directory: each test's default run history is its own temp file."""

from __future__ import annotations

from pathlib import Path

import pytest

from accel_widgets.history import HISTORY_ENV


@pytest.fixture(autouse=True)
def private_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file a panel opened with the default ``history=None`` records to, for this test only."""
    path = tmp_path / "default_history.sqlite"
    monkeypatch.setenv(HISTORY_ENV, str(path))
    return path
