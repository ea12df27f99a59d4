"""PROJECT_SHARES (fair share) and NETS nested a few thousand deep (valid JSON that
json.loads gives up on with RecursionError) are a SettingsError naming the variable, as
invalid JSON is, so `config check` and every process's start say what is wrong."""

from __future__ import annotations

import pytest

from app.errors import SettingsError
from app.settings import Settings

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "name, value",
    [("PROJECT_SHARES", '{"proj": ' + DEEP + "}"), ("NETS", DEEP)],
)
def test_a_deeply_nested_setting_is_a_settings_error_naming_it(tmp_path, name, value):
    try:
        Settings(FL_DISPATCHER_DATA_DIR=tmp_path / "data", **{name: value})
    except SettingsError as exc:
        assert name in str(exc)
    except RecursionError as exc:
        raise AssertionError(f"{name}: RecursionError, no SettingsError") from exc
    else:
        raise AssertionError(f"{name}: accepted")
