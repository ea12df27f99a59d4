"""A job's project (issue 40, fair share): `project_id` in the enqueue payload, else FLIP's
`metadata.project_id` when that is a valid project id, else none (the default project). A
repeat that sends the project in the other place names the same job; a payload without the
field keeps the digests it had before the field existed, and the client sends the field only
when it is set."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.errors import CallerKeyConflict
from app.schemas import EnqueueJob
from app.usecases import declared_nets, enqueue
from tests.unit.conftest import World


def _enqueue(world: World, key: str, **kw: object) -> enqueue.Enqueued:
    with world.rt.sessions.begin() as session:
        declared_nets.sync_nets(session, world.rt.settings, world.clock())
        request = EnqueueJob(caller_key=key, definition="tiny-job", net="net-a", **kw)
        return enqueue.enqueue_job(session, world.rt.settings, request, world.clock())


@pytest.mark.parametrize(
    ("fields", "project"),
    [
        ({"project_id": "p-7"}, "p-7"),
        ({"metadata": {"model_id": "m-1", "project_id": "p-7"}}, "p-7"),
        # The field wins over the metadata.
        ({"project_id": "p-8", "metadata": {"project_id": "p-7"}}, "p-8"),
        # Metadata FLIP's way but not a project id: the default project.
        ({"metadata": {"project_id": "two words"}}, None),
        ({"metadata": {"project_id": 7}}, None),
        ({"metadata": {"project_id": "x" * 101}}, None),
        ({"metadata": {"project_id": ".hidden"}}, None),
        ({"metadata": {"model_id": "m-1"}}, None),
        ({}, None),
    ],
)
def test_a_job_is_in_the_project_its_field_or_its_metadata_names(world, fields, project):
    job_id = _enqueue(world, "k", **fields).job_id
    assert world.job(job_id).project_id == project


@pytest.mark.parametrize("bad", ["", "two words", "a/b", ".p", "x" * 101, "p\u00e9"])
def test_a_project_id_outside_the_identifier_rules_is_refused(bad):
    assert EnqueueJob(caller_key="k", definition="d", project_id="p_7:a@b.c-1").project()
    with pytest.raises(ValidationError, match="project_id"):
        EnqueueJob(caller_key="k", definition="d", project_id=bad)


@pytest.mark.parametrize(
    ("first", "repeat"),
    [
        # FLIP's metadata first, then the field as well (an upgraded flip-api's retry).
        (
            {"metadata": {"model_id": "m-1", "project_id": "p-7"}},
            {"project_id": "p-7", "metadata": {"model_id": "m-1", "project_id": "p-7"}},
        ),
        # The field first, then the same project in the metadata instead.
        (
            {"project_id": "p-7", "metadata": {"model_id": "m-1"}},
            {"metadata": {"model_id": "m-1", "project_id": "p-7"}},
        ),
        ({"project_id": "p-7"}, {"metadata": {"project_id": "p-7"}}),
    ],
)
def test_a_repeat_naming_the_same_project_in_the_other_place_is_the_same_job(world, first, repeat):
    created = _enqueue(world, "k-project", **first)
    again = _enqueue(world, "k-project", **repeat)
    assert (again.job_id, again.created) == (created.job_id, False)


def test_a_repeat_naming_another_project_is_a_conflict_naming_it(world):
    _enqueue(world, "k-project", metadata={"model_id": "m-1", "project_id": "p-7"})
    with pytest.raises(CallerKeyConflict, match=r"differs in: project_id\)"):
        _enqueue(
            world,
            "k-project",
            project_id="p-8",
            metadata={"model_id": "m-1", "project_id": "p-7"},
        )


def test_a_payload_without_project_id_keeps_the_digests_it_had_before_the_field():
    """Jobs stored before 0018 are compared by these digests: an identical retry must still
    name its job (values computed on the code before `project_id` existed)."""
    request = EnqueueJob(
        caller_key="flip-1",
        definition="fedavg",
        net="net-a",
        metadata={"model_id": "m-1", "project_id": "p-7"},
    )
    assert request.digest() == "b02e787263b4175ab8fd97eb0a2f3836638e442d707b05ba358b4c7b38ce4ac5"
    assert (
        request.sent_digest() == "8055d1cd5d9835a5ea2d776774c84539c3473106732dfa674de4a80cb7a6cb4f"
    )
