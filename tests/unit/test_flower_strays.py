"""Stray runs on a Flower net, through the use cases and the real Flower adapter over a fake
Control API: a stray keeps the submit token of its attempt, so settling it looks the token
up and stops the token's later run too (simulation seed 508)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from app.settings import Settings
from app.usecases import abort, dispatch, lost_runs, monitor
from app.usecases.dispatch import Step
from models import StrayRun
from tests.unit.test_flower_dispatch_race import _race, flower_settings  # noqa: F401
from tests.unit.test_flower_fakes import NET


def test_a_lost_job_s_stray_stops_the_later_run_of_its_token_once_the_superlink_answers(
    flower_settings: Settings,  # noqa: F811
    sqlite_factory,
    clock,
    tmp_path: Path,
) -> None:
    """The job adopted the token's first run; another submit's start-run started a later
    one and lost its reply, and the SuperLink refused the lookup that would have stopped it.
    The job is then lost (its SuperLink unreachable past the grace) and requeued, its run
    kept as a stray: settling that stray must stop the later run as well, though its id was
    never learnt."""
    race = _race(flower_settings, sqlite_factory, clock, refused_after=1)
    assert len(race.live_of_token()) == 2, "the later run lives until a lookup stops it"
    watched = monitor.Watched(race.job_id, monitor.JobState.RUNNING, NET, race.kept, None)
    lost_runs.lost(race.b, watched, "server unreachable past the grace")
    with sqlite_factory() as session:
        (stray,) = session.scalars(select(StrayRun)).all()
        assert (stray.nvflare_job_id, stray.submit_token) == (race.kept, race.token)

    assert abort.settle_stray_runs(race.b, NET) == 0
    assert race.live_of_token() == set(), "a run of the lost attempt lives on"


def test_a_chain_retried_from_its_scale_up_stops_the_later_run_of_a_token_the_job_adopted(
    flower_settings: Settings,  # noqa: F811
    sqlite_factory,
    clock,
) -> None:
    """B's submit ran inside a chain whose retry starts again at its scale-up step (seed
    508), and the SuperLink refused B's own lookup: the retry finds the job no longer
    ASSIGNED, and must look the token up there too."""
    race = _race(flower_settings, sqlite_factory, clock, refused_after=1)
    assert dispatch.scale_up(race.b, race.job_id, NET, race.attempt).step == Step.SKIPPED
    assert race.live_of_token() == {race.kept}, "a later run lives beside the adopted one"


def test_the_monitor_stops_a_later_run_of_the_running_job_s_token(
    flower_settings: Settings,  # noqa: F811
    sqlite_factory,
    clock,
) -> None:
    """Seed 508's other half: B's lookup refused and its retries spent (the SuperLink
    unreachable meanwhile), no step of the attempt is left to look the token up, and the
    job runs on: its monitor stops every live run the net's job does not count, once the
    SuperLink answers, and keeps the job's own."""
    race = _race(flower_settings, sqlite_factory, clock, refused_after=1)
    assert race.kept in race.live_of_token() and len(race.live_of_token()) == 2
    with sqlite_factory() as session:
        assert session.get(monitor.Job, race.job_id).state == monitor.JobState.RUNNING
    monitor.monitor_running_jobs(race.b)
    assert race.live_of_token() == {race.kept}, "a later run of the token lives beside the job's"
    with sqlite_factory() as session:
        assert session.get(monitor.Job, race.job_id).state == monitor.JobState.RUNNING
