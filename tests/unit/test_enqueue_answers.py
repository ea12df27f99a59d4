"""What flip-api is told when it enqueues: a caller key seen before returns that job when the
payload is the same (defaults filled in, sites in any order) and is a conflict naming the
fields that differ when it is not, and each refusal says what to fix (the nets it could
name, that sites are needed, that no net is configured, each net's sites when none has all
a job needs, which characters a definition's folder may hold); a folder named with capitals
and digits is fine."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError

from app import names
from app.errors import CallerKeyConflict, InvalidRequest
from app.schemas import EnqueueJob
from app.settings import Settings
from app.usecases import declared_nets, enqueue, records
from models import JobState, Net
from tests.fixtures.db import net_decl


def _enqueue(sqlite_factory, settings, clock, key="k", **kw):
    request = EnqueueJob(caller_key=key, definition=kw.pop("definition", "tiny-job"), **kw)
    with sqlite_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
        return enqueue.enqueue_job(session, settings, request, clock())


def _refusal(sqlite_factory, settings, clock, **kw) -> str:
    with pytest.raises(InvalidRequest) as refused:
        _enqueue(sqlite_factory, settings, clock, **kw)
    return str(refused.value)


def test_a_caller_key_seen_before_with_the_same_payload_returns_its_job(
    sqlite_factory, settings, clock
):
    sites = ["site-1", "site-2"]
    first = _enqueue(sqlite_factory, settings, clock, required_sites=sites)
    # The same request: sites in another order, a default sent explicitly.
    again = _enqueue(sqlite_factory, settings, clock, required_sites=sites[::-1], priority=0)
    assert (again.job_id, again.created, again.state) == (first.job_id, False, JobState.QUEUED)


def test_an_identical_retry_after_a_redeploy_changed_the_defaults_returns_its_job(
    sqlite_factory, tmp_path, job_root, clock
):
    """flip-api's retry sends what it sent before, omitting max_attempts and required_sites;
    meanwhile a redeploy changed MAX_ATTEMPTS and the net's required_sites. The retry is the
    same request (the defaults its job got are the job's own), never a caller_key_conflict."""

    def deployed(sites: list[str], max_attempts: int) -> Settings:
        nets = [net_decl(tmp_path, "net-a", required_sites=sites)]
        return Settings(
            FL_DISPATCHER_DATA_DIR=tmp_path / "data",
            JOB_ROOT=job_root,
            NETS=json.dumps(nets),
            MAX_ATTEMPTS=max_attempts,
        )

    before = deployed(["site-1", "site-2"], max_attempts=3)
    first = _enqueue(sqlite_factory, before, clock, net="net-a")
    after = deployed(["site-1"], max_attempts=5)
    again = _enqueue(sqlite_factory, after, clock, net="net-a")
    assert (again.job_id, again.created) == (first.job_id, False)
    # Spelling out the defaults the job got is the same request too; other values are not.
    spelled = {"required_sites": ["site-2", "site-1"], "max_attempts": 3}
    assert _enqueue(sqlite_factory, after, clock, net="net-a", **spelled).job_id == first.job_id
    with pytest.raises(CallerKeyConflict, match=r"differs in: max_attempts\)"):
        _enqueue(sqlite_factory, after, clock, net="net-a", max_attempts=5)
    with pytest.raises(CallerKeyConflict, match=r"differs in: required_sites\)"):
        _enqueue(sqlite_factory, after, clock, net="net-a", required_sites=["site-1"])


@pytest.mark.parametrize(
    "first",
    [
        {"required_sites": ["site-1"]},  # the net has site-1 and site-2
        {"max_attempts": 5},  # MAX_ATTEMPTS is 3
    ],
)
def test_a_repeat_omitting_a_value_the_job_was_given_explicitly_is_a_conflict(
    sqlite_factory, tmp_path, job_root, clock, first
):
    """Omitted means the default (the net's sites, MAX_ATTEMPTS): a job enqueued for site-1
    alone, or with 5 attempts, is not what a payload without those fields asks for, so the
    repeat is a caller_key_conflict, as it was before identical retries read the job's own
    defaults (tasks/README.md: the same key with a different payload creates nothing and is
    refused; only a *default* spelled out or omitted is alike)."""
    nets = [net_decl(tmp_path, "net-a", required_sites=["site-1", "site-2"])]
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data", JOB_ROOT=job_root, NETS=json.dumps(nets)
    )
    _enqueue(sqlite_factory, settings, clock, net="net-a", **first)
    with pytest.raises(CallerKeyConflict, match="different payload"):
        _enqueue(sqlite_factory, settings, clock, net="net-a")


def test_a_caller_key_reused_with_another_payload_is_a_conflict_naming_the_job(
    sqlite_factory, settings, clock
):
    first = _enqueue(sqlite_factory, settings, clock, required_sites=["site-1"])
    with pytest.raises(CallerKeyConflict) as conflict:
        _enqueue(sqlite_factory, settings, clock, required_sites=["site-1"], priority=5)
    assert str(conflict.value) == (
        f"caller_key 'k' already names job {first.job_id}, enqueued with a different "
        "payload (differs in: priority); a new job needs a new caller_key"
    )
    with sqlite_factory() as session:
        assert records.get_job(session, first.job_id).priority == 0  # unchanged


def _conflict(sqlite_factory, settings, clock, first: dict, again: dict) -> str:
    """How the conflict a second enqueue under the first one's key meets goes on after
    "enqueued with a different payload"."""
    _enqueue(sqlite_factory, settings, clock, **first)
    with pytest.raises(CallerKeyConflict) as conflict:
        _enqueue(sqlite_factory, settings, clock, **again)
    message = str(conflict.value)
    assert "enqueued with a different payload" in message, message
    return message.partition("enqueued with a different payload")[2]


SITES = {"required_sites": ["site-1"]}


@pytest.mark.parametrize(
    ("first", "again", "differ"),
    [
        ({"net": "net-a"}, {"net": "net-b"}, "net"),
        (SITES | {"metadata": {"model": "m1"}}, SITES | {"metadata": {"model": "m2"}}, "metadata"),
        (SITES, {"required_sites": ["site-2"]}, "required_sites"),
        (SITES | {"max_attempts": 2}, SITES | {"max_attempts": 3}, "max_attempts"),
        (SITES | {"max_attempts": 2}, SITES | {"max_attempts": 2, "priority": 5}, "priority"),
        ({"net": "net-a"}, {"net": "net-b", "priority": 5}, "net, priority"),
    ],
    ids=["net", "metadata", "sites", "max_attempts", "priority only", "two fields"],
)
def test_a_conflict_names_the_fields_that_differ(
    sqlite_factory, settings, clock, first, again, differ
):
    """The caller reads which of its fields made the second request another payload."""
    assert _conflict(sqlite_factory, settings, clock, first, again) == (
        f" (differs in: {differ}); a new job needs a new caller_key"
    )


def test_a_conflict_in_a_field_the_message_cannot_show_names_none(sqlite_factory, settings, clock):
    """Another definition is another payload too, but not among the fields the message
    compares: the message then names no field, rather than an empty list."""
    (settings.job_root / "other-job" / "app").mkdir(parents=True)
    (settings.job_root / "other-job" / "meta.json").write_text('{"name": "other-job"}')
    again = SITES | {"definition": "other-job"}
    assert _conflict(sqlite_factory, settings, clock, SITES, again) == (
        "; a new job needs a new caller_key"
    )


def test_a_job_no_net_can_run_is_refused_naming_each_nets_sites(
    sqlite_factory, tmp_path, job_root, clock
):
    nets = [
        net_decl(tmp_path, "net-a", sites=["site-1", "site-2"]),
        net_decl(tmp_path, "net-b", sites=["site-3", "site-4"], required_sites=["site-3"]),
    ]
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data", JOB_ROOT=job_root, NETS=json.dumps(nets)
    )
    assert _refusal(sqlite_factory, settings, clock, required_sites=["site-1", "site-3"]) == (
        "no net has every site in ['site-1', 'site-3']; "
        "net-a has site-1, site-2; net-b has site-3, site-4"
    )


def test_each_refusal_says_what_to_fix(sqlite_factory, settings, clock):
    assert _refusal(sqlite_factory, settings, clock, net="gone") == (
        "unknown net 'gone' (known: net-a, net-b)"
    )
    assert _refusal(sqlite_factory, settings, clock) == (
        "required_sites is empty and no net default applies"
    )


def test_with_no_nets_configured_a_job_is_refused_saying_so(
    sqlite_factory, tmp_path, job_root, clock
):
    settings = Settings(FL_DISPATCHER_DATA_DIR=tmp_path / "data", JOB_ROOT=job_root, NETS="[]")
    assert _refusal(sqlite_factory, settings, clock, net="any") == (
        "unknown net 'any' (known: none)"
    )
    assert _refusal(sqlite_factory, settings, clock, required_sites=["site-1"]) == (
        "no nets are configured, so no job can run"
    )


def test_a_definition_folder_is_named_with_letters_digits_dot_dash_underscore(
    sqlite_factory, settings, clock
):
    for name in ("Job_2.v-1", "bad name"):
        (settings.job_root / name / "app" / "config").mkdir(parents=True)
        (settings.job_root / name / "meta.json").write_text(json.dumps({"name": name}))
    ok = _enqueue(sqlite_factory, settings, clock, "ok", definition="Job_2.v-1", net="net-a")
    assert ok.created
    refused = _refusal(
        sqlite_factory, settings, clock, key="bad", definition="bad name", net="net-a"
    )
    assert refused == (
        "definition folder name 'bad name' may hold only letters, digits, '.', '_', '-'"
    )


# --- the same request in a world with nets (a repeat, a live job's key) ----------------------


def _enqueue_in(world, key: str, **kw):
    """Enqueue in the world's runtime: its answer."""
    with world.rt.sessions.begin() as session:
        return enqueue.enqueue_job(
            session,
            world.rt.settings,
            EnqueueJob(caller_key=key, definition="tiny-job", **kw),
            world.clock(),
        )


def test_repeat_with_max_attempts_spelled_out_as_its_default_is_the_same_request(world) -> None:
    """Scenario: flip-api enqueues {caller_key, definition, net} (max_attempts omitted, so
    MAX_ATTEMPTS=3); its retry spells the default out, max_attempts=3: the very job it
    names. Promise (tasks/README.md, Task API): "a repeat with the same payload (defaults
    filled in) returns the same job". Here the retry is refused 409 caller_key_conflict (the
    digest fills in the schema's null, not the setting it stands for; the message lists no
    differing field)."""
    first = _enqueue_in(world, "k-defaults", net="net-a")
    again = _enqueue_in(
        world, "k-defaults", net="net-a", max_attempts=world.rt.settings.max_attempts
    )
    assert (again.job_id, again.created) == (first.job_id, False)


def test_repeat_with_the_nets_default_sites_spelled_out_is_the_same_request(world) -> None:
    """Scenario: an enqueue for net-a omits required_sites (so the net's site-1, site-2);
    the retry sends required_sites=[site-2, site-1], the very sites the job has. Promise
    (tasks/README.md, Task API): "defaults filled in, sites in any order" names the same
    job; here it is a 409 caller_key_conflict, with no differing field named."""
    first = _enqueue_in(world, "k-sites", net="net-a")
    again = _enqueue_in(world, "k-sites", net="net-a", required_sites=["site-2", "site-1"])
    assert (again.job_id, again.created) == (first.job_id, False)


def test_an_invalid_repeat_of_a_live_jobs_caller_key_is_a_conflict_not_a_rejection(
    world,
) -> None:
    """Scenario: job k-live is QUEUED (or RUNNING); flip-api sends enqueue_job again with the
    same caller_key and another payload that also fails the schema (priority 5000). Schema
    validation runs before the key lookup, so it is recorded and pushed as reason_code
    `rejected` with job_id = the live job's id, and REASONS maps `rejected` to ERROR /
    COMPLETED: a receiver following the reason table ends the live job's model in ERROR.
    Promise (Task API): the same caller_key with a different payload creates nothing and
    changes nothing: caller_key_conflict, "that job is unchanged (keep its status)". Fix: in
    the task (and POST /jobs), when the payload's caller_key is usable and names an existing
    job, refuse any payload that is not its repeat as caller_key_conflict, validation
    error included in the reason."""
    from models.reasons import REASONS, ReasonCode
    from tasks import base
    from tasks.registered import TASKS

    live = world.enqueue("k-live", net="net-a")
    base.set_runtime(world.rt)
    try:
        answer = TASKS[names.ENQUEUE_JOB].run(
            payload={
                "caller_key": "k-live",
                "definition": "tiny-job",
                "net": "net-a",
                "priority": 5000,
            }
        )
    finally:
        base.set_runtime(None)
    assert world.job(live).state.value == "QUEUED"
    code = ReasonCode(answer["reason_code"])
    assert REASONS[code].flip[None].model_status is None, (
        f"a refused repeat of live job {live} goes out as {code}: flip-api sets "
        f"{REASONS[code].flip[None]}"
    )


def test_a_concurrent_enqueue_of_the_key_winning_while_the_net_rows_are_made_is_answered(
    sqlite_factory, settings, clock, monkeypatch
):
    """No net row yet (a deploy that added the net): the enqueue makes the rows and inserts
    again. A concurrent enqueue of the same key that committed meanwhile (on PostgreSQL; staged
    here by running it at that moment) wins: its job is the answer, as a repeat."""
    request = EnqueueJob(caller_key="k", definition="tiny-job", net="net-a")
    make_rows = declared_nets.ensure_net_rows
    rival: list[enqueue.Enqueued] = []

    def rows_then_rival(session, settings_, now):
        make_rows(session, settings_, now)
        rival.append(enqueue.enqueue_job(session, settings_, request, now))

    monkeypatch.setattr(declared_nets, "ensure_net_rows", rows_then_rival)
    with sqlite_factory.begin() as session:
        answer = enqueue.enqueue_job(session, settings, request, clock())
    assert rival[0].created
    assert (answer.job_id, answer.created) == (rival[0].job_id, False)


def test_an_insert_failing_again_with_no_job_under_the_key_is_raised(
    sqlite_factory, settings, clock, monkeypatch
):
    """The second insert fails and no job has the key (staged: the net's row gone again before
    it): that is no repeat to answer, so the insert's error is raised."""
    request = EnqueueJob(caller_key="k", definition="tiny-job", net="net-a")
    make_rows = declared_nets.ensure_net_rows

    def rows_then_gone(session, settings_, now):
        make_rows(session, settings_, now)
        session.execute(delete(Net).where(Net.name == "net-a"))

    monkeypatch.setattr(declared_nets, "ensure_net_rows", rows_then_gone)
    with pytest.raises(IntegrityError), sqlite_factory.begin() as session:
        enqueue.enqueue_job(session, settings, request, clock())
