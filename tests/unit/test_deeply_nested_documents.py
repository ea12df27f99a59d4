"""Every document the dispatcher reads from outside (a nets file, an admin kit's
fed_admin.json, a Flower App's pyproject.toml, a SuperLink's error body) nested a few
thousand deep (valid JSON or TOML that Python's parsers give up on with RecursionError) is
read as its malformed kin are: the error names the file, never a bare RecursionError."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from app.adapters.flower import classify, fab
from app.adapters.nvflare.kit_check import check_kit_files
from app.errors import AdminMisconfigured, InvalidRequest, SettingsError
from app.net_config import load_nets_file

DEEP_JSON = "[" * 100_000 + "]" * 100_000
DEEP_TOML = "a = " + "[" * 5000 + "]" * 5000 + "\n"


@pytest.mark.parametrize("name, text", [("nets.json", DEEP_JSON), ("nets.toml", DEEP_TOML)])
def test_a_deeply_nested_nets_file_is_a_settings_error_naming_it(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SettingsError, match=f"NETS_FILE={path}: nested too deeply"):
        load_nets_file(path)


def test_a_deeply_nested_admin_config_makes_the_kit_misconfigured(tmp_path):
    (tmp_path / "startup").mkdir()
    (tmp_path / "startup" / "fed_admin.json").write_text(DEEP_JSON)
    with pytest.raises(AdminMisconfigured, match="nested too deeply"):
        check_kit_files(tmp_path)


def test_a_deeply_nested_flower_pyproject_is_an_invalid_request():
    with pytest.raises(InvalidRequest, match="nested too deeply"):
        fab.declare_keys(DEEP_TOML, Path("app"))


def test_a_deeply_nested_error_body_is_read_as_no_flower_json():
    answer = httpx.Response(500, content=DEEP_JSON.encode())
    assert classify.error_code(answer) is None
    assert "HTTP 500" in str(classify.classified_http_error(answer, "submit"))
