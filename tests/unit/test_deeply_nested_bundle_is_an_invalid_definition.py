"""A job bundle whose meta.json (NVFLARE) or pyproject.toml (any bundle: prepare() asks
every one whether it is a Flower App) nests arrays a few thousand deep is the job's fault,
as test_flower_bad_bundles.py promises for a malformed pyproject: the submit refuses it as
an invalid definition (the job FAILED at once, `definition_invalid`), "never with an error
nobody classified, which a pipeline step raises loudly and the lease re-drives until the job
has spent its attempts, holding its net each time". Python's json and tomllib parsers raise
RecursionError on such input (neither JSONDecodeError nor TOMLDecodeError), and nothing
catches it."""

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


def test_a_deeply_nested_pyproject_fails_its_job_as_an_invalid_definition(world, job_root):
    (job_root / "tiny-job" / "pyproject.toml").write_text(
        "a = " + "[" * 5000 + "]" * 5000 + "\n"
    )
    job_id = world.enqueue("deep-pyproject", net="net-a")
    _fails_at_once(world, job_id)
