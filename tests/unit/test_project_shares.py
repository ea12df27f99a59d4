"""PROJECT_SHARES and AGING_S (issue 40, fair share): each project's weight and optional cap
of nets, read once with the other settings; a bad value stops the start with an error that
names the project and the field (what `fl-dispatcher config check` prints)."""

from __future__ import annotations

import pytest

from app.errors import SettingsError
from app.project_shares import MAX_AGING_S, Shares
from app.settings import Settings
from tests.unit.test_fair_share import claim, enqueue, fair_world


def test_by_default_every_project_weighs_one_has_no_cap_and_ages_after_six_hours():
    shares = Settings().shares
    assert shares == Shares((), (), 21600.0)
    assert (shares.weight("p-1"), shares.cap("p-1"), shares.weight(None)) == (1.0, None, 1.0)


def test_weights_and_caps_are_read_per_project():
    settings = Settings(
        PROJECT_SHARES='{"p-1": {"weight": 3}, "p-2": {"max_nets": 1}, "p-3": {}}',
        AGING_S=60,
    )
    shares = settings.shares
    assert (shares.weight("p-1"), shares.cap("p-1")) == (3.0, None)
    assert (shares.weight("p-2"), shares.cap("p-2")) == (1.0, 1)
    assert (shares.weight("p-3"), shares.cap("p-3")) == (1.0, None)
    assert (shares.weight("other"), shares.cap(None), shares.aging_s) == (1.0, None, 60.0)


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("weights", "PROJECT_SHARES: not valid JSON"),
        ('[{"weight": 1}]', "PROJECT_SHARES must be a JSON object"),
        ('{"two words": {}}', "'two words' is not a project id"),
        ('{"p-1": {"weight": 0}}', "project 'p-1': field 'weight': Input should be greater"),
        ('{"p-1": {"weight": 1e-320}}', "project 'p-1': field 'weight'"),
        ('{"p-1": {"weight": "2"}}', "project 'p-1': field 'weight'"),
        ('{"p-1": {"max_nets": 0}}', "project 'p-1': field 'max_nets'"),
        ('{"p-1": {"max_nets": 1.5}}', "project 'p-1': field 'max_nets'"),
        ('{"p-1": {"share": 2}}', "project 'p-1': field 'share': Extra inputs"),
        ('{"p-1": 2}', "project 'p-1'"),
    ],
)
def test_a_bad_project_share_stops_the_start_naming_the_project_and_the_field(raw, says):
    with pytest.raises(SettingsError, match=says):
        Settings(PROJECT_SHARES=raw)


@pytest.mark.parametrize("aging", ["0", "-1", "inf", "soon"])
def test_aging_must_be_a_positive_number_of_seconds(aging):
    with pytest.raises((SettingsError, ValueError), match="AGING_S"):
        Settings(AGING_S=aging)


@pytest.mark.parametrize("aging", ["1e11", "1e20"])
def test_an_aging_no_claim_can_subtract_from_now_stops_the_start(aging):
    """AGING_S set huge to switch aging off: now - AGING_S is before year 1 (or no
    timedelta at all), so every claim and every queued job's view raised OverflowError:
    no job was ever claimed again. Refused at the start instead."""
    with pytest.raises((SettingsError, ValueError), match="AGING_S"):
        Settings(AGING_S=aging)


def test_the_longest_aging_still_claims(tmp_path, job_root, sqlite_factory, clock):
    """The largest AGING_S accepted (aging off in effect) orders the queue like any other."""
    world = fair_world(tmp_path, job_root, sqlite_factory, clock, ["net-1"], AGING_S=MAX_AGING_S)
    enqueue(world, "a-0", "a")
    assert claim(world) == ("a-0", "net-1")
