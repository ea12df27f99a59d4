"""parse_flag, the one parser of every boolean setting: values that are already booleans or
missing, and the error an operator reads for anything else."""

from __future__ import annotations

import pytest

from app.errors import SettingsError
from app.flags import parse_flag


@pytest.mark.parametrize("default", [True, False])
def test_a_missing_or_empty_value_is_the_default(default):
    assert parse_flag("X", None, default=default) is default
    assert parse_flag("X", "  ", default=default) is default


@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_is_taken_as_it_is(value):
    assert parse_flag("X", value, default=not value) is value


@pytest.mark.parametrize(("raw", "expected"), [(1, True), (0, False)])
def test_a_number_reads_as_its_text(raw, expected):
    assert parse_flag("X", raw, default=not expected) is expected


def test_anything_else_is_refused_naming_the_setting_the_choices_and_the_default():
    with pytest.raises(SettingsError) as refused:
        parse_flag("PER_JOB_FL_SERVER", "maybe", default=False)
    assert str(refused.value) == (
        "PER_JOB_FL_SERVER='maybe' is not a boolean; accepted (any case): "
        "true/false, 1/0, yes/no, on/off, or empty for the default (false)"
    )
