"""Settings validation (review 21, each test failing on the code before its fix): a duration
`config check` accepts must not break a loop or a request later. AGING_S is bounded
(MAX_AGING_S) and refuses inf because the claim subtracts it from now; REPORT_TIMEOUT_S and
REJECTED_RETENTION_S were used the same way (`now - timedelta(seconds=...)`) with no bound:
"inf", or any value past about 2,000 years (the natural ways to write "wait for ever" / "keep
for ever"), raised OverflowError at use.

- REPORT_TIMEOUT_S: `report_waits.expire_report_waits` computes its cutoff outside the
  per-net isolation, so once one job is FINISHING the whole monitor round raises, every
  round: no other net's finished run is settled (jobs stuck RUNNING, nets stuck BUSY).
- REJECTED_RETENTION_S: `enqueue.record_rejection` prunes with it, so recording a refused
  enqueue raises OverflowError out of the request task, which is judged FAILED and
  acknowledged: the refusal is lost (no rejection row, no `rejected` callback).

Either fix passes: refuse such values at start (as AGING_S does), or bound them at use.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.errors import SettingsError
from app.schemas import job_id_for
from app.usecases import enqueue as enqueue_uc
from app.usecases import monitor, requests
from models import JobState
from tests.fixtures.db import net_decl
from tests.unit.conftest import world_of

FOR_EVER = ["inf", "1e11"]  # 1e11 s: about 3,170 years


def _world_or_refused(tmp_path, job_root, sqlite_factory, clock, nets, **extra):
    """The world with these settings, or None when the settings refuse them at start."""
    try:
        return world_of(nets, tmp_path, job_root, sqlite_factory, clock, **extra)
    except (SettingsError, ValidationError):
        return None  # refused with a clear error at start: the other fix


@pytest.mark.parametrize("timeout", FOR_EVER)
def test_a_report_timeout_of_for_ever_stops_no_monitor_round(
    tmp_path, job_root, sqlite_factory, clock, timeout
) -> None:
    """Scenario: RELEASE_AFTER=reported, REPORT_TIMEOUT_S=inf (flip-api may take as long as
    it takes); a job on net `held` is FINISHING, and the run of a job on net `other`
    completes. Promise (app/usecases/README.md): every housekeeping loop handles each net on
    its own. Broke: OverflowError out of monitor_running_jobs, every round."""
    nets = [net_decl(tmp_path, "held", "ecs"), net_decl(tmp_path, "other", "ecs")]
    world = _world_or_refused(
        tmp_path,
        job_root,
        sqlite_factory,
        clock,
        nets,
        RELEASE_AFTER="reported",
        REPORT_TIMEOUT_S=timeout,
    )
    if world is None:
        return
    first = world.enqueue("on-held", net="held")
    world.run_pipeline(first)
    world.server("held").statuses["nv-1"] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    assert world.job(first).state == JobState.FINISHING

    second = world.enqueue("on-other", net="other")
    world.run_pipeline(second)
    world.server("other").statuses["nv-1"] = "FINISHED:COMPLETED"
    clock.advance(30)
    try:
        monitor.monitor_running_jobs(world.rt)
    except OverflowError as exc:
        raise AssertionError(f"the monitor round raised: OverflowError: {exc}") from None
    assert world.job(second).state == JobState.FINISHING  # its run's end recorded


@pytest.mark.parametrize("retention", FOR_EVER)
def test_a_refused_enqueue_is_recorded_whatever_the_retention(
    tmp_path, job_root, sqlite_factory, clock, retention
) -> None:
    """Scenario: REJECTED_RETENTION_S=inf (keep refusals for ever); flip-api sends an enqueue
    naming a net that does not exist. Promise (tasks/README.md, requests.py): a refused
    enqueue is recorded, so the caller can tell "rejected" from "not yet processed"; a
    request is never acknowledged away unrecorded. Broke: OverflowError out of the task
    (record_rejection's pruning cutoff); the handler's verdict is FAILED, the message gone."""
    nets = [net_decl(tmp_path, "net-a", "ecs")]
    world = _world_or_refused(
        tmp_path, job_root, sqlite_factory, clock, nets, REJECTED_RETENTION_S=retention
    )
    if world is None:
        return
    payload = {"caller_key": "k-refused", "definition": "tiny-job", "net": "no-such-net"}
    try:
        answer = requests.enqueue_job(world.rt, payload, message_id="m-1")
    except OverflowError as exc:
        raise AssertionError(f"the refused enqueue raised: OverflowError: {exc}") from None
    assert answer.get("rejected")
    with world.rt.sessions() as session:
        assert enqueue_uc.get_rejection(session, job_id_for("k-refused")) is not None


def _duration_settings() -> list[str]:
    """Every duration setting (an alias ending in _S with a float value)."""
    from app.settings import Settings

    return sorted(
        str(f.alias)
        for f in Settings.model_fields.values()
        if f.alias and f.alias.endswith("_S") and f.annotation in (float, "float")
    )


@pytest.mark.parametrize("name", _duration_settings())
@pytest.mark.parametrize("value", [*FOR_EVER, "nan"])
def test_every_duration_setting_refuses_for_ever_at_start(tmp_path, job_root, name, value):
    """Not only the two above: every `*_S` duration is added to or subtracted from now
    somewhere (STUCK_AFTER_S, PREWARM_MAX_S, HOUSEKEEPING_INTERVAL_S ...); each is finite
    and at most MAX_SECONDS (about 31 years), refused with its name at start."""
    from app.settings import load_settings

    with pytest.raises(SettingsError, match=name):
        load_settings(
            FL_DISPATCHER_DATA_DIR=str(tmp_path / "data"), JOB_ROOT=job_root, **{name: value}
        )


@pytest.mark.parametrize("value", [float("inf"), 1e11])
@pytest.mark.parametrize(
    "field", ["idle_timeout_s", "ready_timeout_s", "max_run_s", "report_timeout_s"]
)
def test_every_duration_of_a_net_refuses_for_ever(tmp_path, field, value):
    from app.net_config import NetConfig

    with pytest.raises(ValidationError, match=field):
        NetConfig.model_validate(net_decl(tmp_path, "net-a", "static", **{field: value}))
