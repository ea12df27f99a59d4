"""A job bundle's files nested a few thousand deep (valid JSON or TOML that Python's parsers
give up on with RecursionError, neither JSONDecodeError nor TOMLDecodeError) are read as
their malformed kin are: a meta.json is the job's fault (FAILED at once,
`definition_invalid`, never an error nobody classified, which a step raises loudly and the
lease re-drives, holding the net each time); a pyproject.toml only says "no Flower App"."""

from __future__ import annotations

from app.usecases import dispatch, records
from app.usecases.dispatch import Step
from models import JobState, ReasonCode

DEEP = 100_000


def _fails_at_once(world, job_id) -> None:
    net, attempt = world.run_until_ready(job_id)
    try:
        result = dispatch.dispatch(world.rt, job_id, net, attempt)
    except RecursionError as exc:  # what the step raises today
        raise AssertionError(f"the submit raised {type(exc).__name__}, unclassified") from exc
    assert result.step == Step.GAVE_UP
    with world.rt.sessions() as session:
        job = records.get_job(session, job_id)
        assert (job.state, job.reason_code) == (JobState.FAILED, ReasonCode.DEFINITION_INVALID)


def test_a_deeply_nested_meta_json_fails_its_job_as_an_invalid_definition(world, job_root):
    (job_root / "deep").mkdir()
    (job_root / "deep" / "meta.json").write_text("[" * DEEP + "]" * DEEP)
    job_id = world.enqueue("deep-meta", net="net-a")
    with world.rt.sessions.begin() as session:
        records.get_job(session, job_id).definition = "deep"
    _fails_at_once(world, job_id)


def test_a_deeply_nested_pyproject_is_no_flower_app_and_its_job_runs(world, job_root):
    """An NVFLARE bundle's pyproject.toml that cannot be read (invalid TOML, or nesting past
    the recursion limit) only means the bundle is no Flower App: the job is submitted."""
    (job_root / "tiny-job" / "pyproject.toml").write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    job_id = world.enqueue("deep-pyproject", net="net-a")
    net, attempt = world.run_until_ready(job_id)
    try:
        result = dispatch.dispatch(world.rt, job_id, net, attempt)
    except RecursionError as exc:
        raise AssertionError(f"the submit raised {type(exc).__name__}, unclassified") from exc
    assert result.step == Step.DONE
