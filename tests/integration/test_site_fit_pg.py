"""`app.usecases.site_fit` on both databases: the claim and the idle check ask the database
whether a job's required sites are all among a net's, PostgreSQL by jsonb containment and
SQLite with json_each, and both must answer as `NetConfig.lacks` does in Python."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.usecases import site_fit
from models import Job, JobState

pytestmark = pytest.mark.integration

NET = ["site-1", "site-2", 'hôpital "B"', "site,3", "site-🏥"]
CASES = [
    ([], True),
    (["site-1"], True),
    (["site-2", "site-1"], True),
    (["site-1", "site-1"], True),
    (['hôpital "B"'], True),
    (["site,3"], True),
    (["site-🏥", "site-2"], True),
    (["site-9"], False),
    (["site-1", "site-9"], False),
    (["site"], False),  # a prefix of a site is not the site
    (["Site-1"], False),  # nor another case
]


@pytest.mark.parametrize("database", ["sqlite_factory", "pg_factory"])
def test_sites_within_answers_as_the_nets_lacks(request, database, clock):
    factory = request.getfixturevalue(database)
    ids: dict[object, list[str]] = {}
    with factory.begin() as session:
        for i, (sites, _) in enumerate(CASES):
            job = Job.new(
                caller_key=f"k{i}",
                definition="tiny-job",
                required_sites=sites,
                requested_net=None,
                priority=0,
                max_attempts=3,
                now=clock(),
            )
            session.add(job)
            ids[job.id] = sites
    with factory() as session:
        fitting = set(
            session.scalars(
                select(Job.id).where(
                    Job.state == JobState.QUEUED, site_fit.sites_within(Job.required_sites)
                ),
                site_fit.net_sites_param(NET),
            )
        )
    expected = {job_id for job_id, sites in ids.items() if all(s in NET for s in sites)}
    assert fitting == expected
    assert len(expected) == sum(fits for _, fits in CASES)  # the cases' own answers agree
