"""The claim's statements are built once per process (app.usecases.claims._statement, issue
37), not once per claim: a worker that claims for months must not keep one more statement
for every claim it ever made."""

from __future__ import annotations

from app.usecases import claims
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of


def _claim_and_finish(world: World, key: str, **kw: object) -> None:
    job_id = world.enqueue(key, **kw)
    world.run_to_completion(job_id)


def test_claims_build_no_new_statement_once_each_kind_is_built(
    tmp_path, job_root, sqlite_factory, clock
):
    nets = [
        net_decl(tmp_path, "plain", "static"),
        net_decl(tmp_path, "sited", "static", sites=["site-1", "site-2", "site-3"]),
    ]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock, PER_JOB_FL_SERVER="false")
    # Every kind of claim once: plain and sited nets, with and without a prewarm key.
    _claim_and_finish(world, "warm-plain", net="plain")
    _claim_and_finish(world, "warm-sited", net="sited")
    _claim_and_finish(world, "warm-named", net="plain", prewarm_key="pk-0")
    built = len(claims._BUILT)

    for i in range(5):
        _claim_and_finish(world, f"plain-{i}", net="plain")
        _claim_and_finish(world, f"sited-{i}", net="sited")
        _claim_and_finish(world, f"named-{i}", net="plain", prewarm_key=f"pk-{i + 1}")

    assert len(claims._BUILT) == built
