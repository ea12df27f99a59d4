"""Break of round 23's change 1 (app/adapters/jobdefs.py `refuse_links_out`).

Promise (changelog Unreleased): a file in a job folder that links out of JOB_ROOT "fails
the job definition_invalid"; the brief's rule for any refusal there: the job ends FAILED
definition_invalid, its net released, its events sent once.

Found: the refusal names the link by its path (`f"{bundle.name}/{relative} links outside
the job root"`), and a file name the disk holds in bytes that are not UTF-8 (a tar or zip
from flip-api keeps them) reaches Python as a lone surrogate (`\\udcff`). The job's failure
reason then cannot be stored: `UnicodeEncodeError` escapes the dispatch step (unclassified),
the job stays DISPATCHING on its net and is re-driven into the same error. `_copy_within`'s
message (`os.path.basename(source)`) has the same hole. Fix: name the link with
`app.errors.quoted` (or `storable`), as the rest of the round does for a caller's text."""

from __future__ import annotations

import os

from app.usecases import dispatch, records
from models import JobState, ReasonCode


def test_a_link_out_of_the_root_with_a_non_utf8_name_fails_the_job_definition_invalid(
    world, job_root, tmp_path
):
    outside = tmp_path / "kits" / "client.key"
    outside.parent.mkdir(parents=True)
    outside.write_text("-----BEGIN PRIVATE KEY-----")
    config = job_root / "tiny-job" / "app" / "config"
    os.symlink(outside, os.fsencode(config) + b"/weights-\xff.pem")
    job_id = world.enqueue("odd-name", net="net-a")
    net, attempt = world.run_until_ready(job_id)

    try:
        dispatch.dispatch(world.rt, job_id, net, attempt)
    except Exception as exc:
        raised = f"{type(exc).__name__}: {exc}"
    else:
        raised = None

    with world.rt.sessions() as session:
        job = records.get_job(session, job_id)
        state = (job.state, job.reason_code)
    assert (raised, state) == (None, (JobState.FAILED, ReasonCode.DEFINITION_INVALID)), (
        f"dispatch raised {raised!r}; the job is left {state[0]} on its net"
    )
