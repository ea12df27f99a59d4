"""ECS nets on one cluster observed in batches inside an observation pass, without a network
(a real client answered by botocore's Stubber, which checks every request and response
against the ECS model): what a batch asks for, what each net is told, and that nothing the
pass holds outlives a scale call or is served twice. The call counts against moto's server
at 1,000 nets are in tests/integration/test_ecs_batching.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from app.adapters.drivers.base import Observation, observation_pass
from app.adapters.drivers.ecs import EcsDriver, EcsServiceGroup
from app.errors import DriverMisconfigured
from app.net_config import EcsDriverConfig

KEY = ("eu-west-2", "http://127.0.0.1:9", "flip")  # never contacted: the Stubber answers
SERVICES = [f"svc-{i:02d}" for i in range(25)]


def _service(name: str, desired: int = 0) -> dict[str, Any]:
    return {
        "serviceName": name,
        "status": "ACTIVE",
        "desiredCount": desired,
        "runningCount": desired,
        "pendingCount": 0,
    }


def _answer(names: list[str], missing: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "services": [_service(n, desired=int(n[-2:]) % 2) for n in names if n not in missing],
        "failures": [
            {"arn": f"arn:aws:ecs:eu-west-2:123456789012:service/flip/{n}", "reason": "MISSING"}
            for n in missing
        ],
    }


@pytest.fixture
def group() -> Iterator[tuple[dict[str, EcsDriver], Stubber]]:
    session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing")
    client = session.client("ecs", region_name=KEY[0], endpoint_url=KEY[1])
    shared = EcsServiceGroup(KEY, [(f"net-{s}", s) for s in SERVICES], client=client)
    drivers = {
        s: EcsDriver(
            EcsDriverConfig(
                kind="ecs", region=KEY[0], cluster=KEY[2], service=s, endpoint_url=KEY[1]
            ),
            group=shared,
        )
        for s in SERVICES
    }
    with Stubber(client) as stubber:
        yield drivers, stubber
        stubber.assert_no_pending_responses()


def _expect(stubber: Stubber, names: list[str], missing: tuple[str, ...] = ()) -> None:
    stubber.add_response(
        "describe_services", _answer(names, missing), {"cluster": "flip", "services": names}
    )


def test_outside_a_pass_every_observation_is_one_fresh_call(group):
    drivers, stubber = group
    _expect(stubber, ["svc-03"])
    _expect(stubber, ["svc-03"])
    assert drivers["svc-03"].observe() == Observation(1, 1, 0)
    assert drivers["svc-03"].observe() == Observation(1, 1, 0)


def test_a_pass_reads_ten_services_a_call_in_declaration_order(group):
    drivers, stubber = group
    for start in (0, 10, 20):
        _expect(stubber, SERVICES[start : start + 10])
    with observation_pass():
        seen = {s: drivers[s].observe() for s in SERVICES}
    assert seen == {s: Observation(int(s[-2:]) % 2, int(s[-2:]) % 2, 0) for s in SERVICES}


def test_a_planned_pass_batches_exactly_the_planned_nets(group):
    drivers, stubber = group
    planned = ["svc-24", "svc-02", "svc-13"]
    _expect(stubber, planned)
    with observation_pass(order=[f"net-{s}" for s in planned]):
        for s in planned:
            drivers[s].observe()


def test_a_missing_service_is_its_own_nets_error_only(group):
    drivers, stubber = group
    _expect(stubber, SERVICES[:10], missing=("svc-04",))
    with observation_pass():
        assert drivers["svc-00"].observe() == Observation(0, 0, 0)
        with pytest.raises(DriverMisconfigured, match=r"flip/svc-04 in eu-west-2.*MISSING"):
            drivers["svc-04"].observe()
        assert drivers["svc-05"].observe() == Observation(1, 1, 0)


def test_a_batch_that_fails_as_a_whole_is_retried_for_the_asking_net_alone(group):
    drivers, stubber = group
    stubber.add_client_error(
        "describe_services",
        "AccessDeniedException",
        "not authorized to perform ecs:DescribeServices on svc-07",
        400,
        expected_params={"cluster": "flip", "services": SERVICES[:10]},
    )
    _expect(stubber, ["svc-00"])
    _expect(stubber, ["svc-01", *SERVICES[2:11]])  # svc-00 was read: the next ten
    with observation_pass():
        assert drivers["svc-00"].observe() == Observation(0, 0, 0)
        assert drivers["svc-01"].observe() == Observation(1, 1, 0)


def test_a_second_look_or_a_scale_reads_afresh(group):
    drivers, stubber = group
    _expect(stubber, SERVICES[:10])
    _expect(stubber, ["svc-00", *SERVICES[10:19]])  # svc-00 again: not served twice
    _expect(stubber, ["svc-01"])  # scale reads its service afresh ...
    stubber.add_response(
        "update_service",
        {"service": _service("svc-01", desired=0)},
        {"cluster": "flip", "service": "svc-01", "desiredCount": 0},
    )
    _expect(stubber, ["svc-01", *SERVICES[19:25]])  # ... and forgets what the pass held
    with observation_pass():
        drivers["svc-00"].observe()
        drivers["svc-00"].observe()
        drivers["svc-01"].scale(0)
        drivers["svc-01"].observe()
