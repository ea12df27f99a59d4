"""Review b: a job folder whose file links out of JOB_ROOT ships the linked file to the
FL server.

Promise (app/usecases/enqueue.py `resolve_definition`): a definition is "a folder inside
`JOB_ROOT`", and "resolve() follows symlinks, so a link pointing outside the root is caught
here too"; the S3 bundles refuse "keys that would land outside the job folder"
(app/adapters/README.md "S3 job bundles"). The prepared copy that is submitted follows
links (`copytree(symlinks=False)`, app/adapters/jobdefs.py `prepare`) on purpose, for code
shared inside the root (tests/unit/test_flip_flow.py) -- but nothing checks where a link
inside the job folder points.

Scenario: flip-api unpacks a user's job into JOB_ROOT (a tar or zip keeps symlinks); one
file of it is a link to a file of the worker's host outside the root: the net's NVFLARE
admin kit's private key (compose mounts the kits at /etc/fl-dispatcher/kits), or
/proc/self/environ (the worker's environment: DATABASE_URL with its password,
CALLBACK_SECRET, API_SECRET, AWS keys). The job is enqueued and dispatched.

What happens: the enqueue is accepted and the submitted copy holds the linked file's
bytes: the admin key, or the worker's environment, is uploaded to the FL server, where the
job's own code (and, through the deploy map, every hospital site) reads it -- exactly what
compose.yml keeps the fl-server's network away from.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from app.errors import InvalidRequest

SECRET = "-----BEGIN PRIVATE KEY----- admin-kit-key-4f2e9d"


def _submitted_bytes(world) -> bytes:
    seen = b""
    for folder in world.server("net-a").folders:
        for path in Path(folder).rglob("*"):
            if path.is_file():
                seen += path.read_bytes()
    return seen


def _dispatch_or_refuse(world) -> bytes:
    """Enqueue and run the job; what reached the server ('' when it was refused)."""
    try:
        job_id = world.enqueue("linked-out", net="net-a")
    except InvalidRequest:
        return b""
    with contextlib.suppress(AssertionError):  # the dispatch refused it: nothing submitted
        world.run_pipeline(job_id)
    return _submitted_bytes(world)


def test_a_file_linked_from_outside_the_job_root_is_not_submitted(world, job_root, tmp_path):
    kit_key = tmp_path / "kits" / "net-a" / "admin@flip.example" / "startup" / "client.key"
    kit_key.parent.mkdir(parents=True)
    kit_key.write_text(SECRET)
    assert not kit_key.resolve().is_relative_to(job_root.resolve())
    (job_root / "tiny-job" / "app" / "config" / "weights.pem").symlink_to(kit_key)

    submitted = _dispatch_or_refuse(world)

    assert SECRET.encode() not in submitted, (
        "the admin kit's private key, outside JOB_ROOT, was submitted to the FL server"
    )


def test_the_workers_environment_is_not_submitted_through_a_link(world, job_root):
    """/proc/self/environ holds the environment the worker was started with (compose's
    DATABASE_URL with POSTGRES_PASSWORD, CALLBACK_SECRET, API_SECRET, AWS_* keys)."""
    environ = Path("/proc/self/environ")
    started_with = environ.read_bytes()
    if not started_with:
        pytest.skip("no /proc/self/environ here")
    (job_root / "tiny-job" / "app" / "config" / "env.txt").symlink_to(environ)

    submitted = _dispatch_or_refuse(world)

    leaked = started_with in submitted  # compared, never printed: it is an environment
    assert not leaked, "the worker's whole environment was submitted to the FL server"


def test_a_job_folder_swapped_for_a_link_out_of_the_root_after_enqueue_is_not_submitted(
    world, job_root, tmp_path
):
    """The root check runs at enqueue only: `materialize` resolves the stored definition
    again at dispatch (`records.job_folder`) without asking whether it is still under
    JOB_ROOT, so a folder replaced by a link between the two (the job waited QUEUED for
    hours) is submitted from wherever the link points."""
    outside = tmp_path / "kits" / "tiny-job"
    (outside / "app").mkdir(parents=True)
    (outside / "meta.json").write_text('{"deploy_map": {"app": ["@ALL"]}}')
    (outside / "app" / "client.key").write_text(SECRET)
    job_id = world.enqueue("swapped", net="net-a")
    (job_root / "tiny-job").rename(job_root / "tiny-job.old")
    (job_root / "tiny-job").symlink_to(outside, target_is_directory=True)
    with contextlib.suppress(AssertionError):  # the dispatch refused it: nothing submitted
        world.run_pipeline(job_id)

    assert SECRET.encode() not in _submitted_bytes(world), (
        "a folder outside JOB_ROOT was submitted as the job"
    )
