"""EcsDriver against moto's server over real HTTP on loopback (tests/fixtures/aws.py).

What moto cannot produce is covered by a recorded DescribeServices response fed to a real
client through botocore's Stubber, which validates it against the ECS service model:
- running < desired (pending) IS produced by moto: a service created with desiredCount=1
  while MOTO_ECS_SERVICE_RUNNING is 0 reports runningCount=0, pendingCount=1 and an
  IN_PROGRESS deployment (only UpdateService makes moto set running = desired at once);
- a deployment the circuit breaker marked FAILED, and a DRAINING service, are not: Stubber.
"""

from __future__ import annotations

import datetime as dt
import socket
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError
from botocore.stub import Stubber

from app.adapters.drivers.base import Observation
from app.adapters.drivers.ecs import EcsDriver, make_ecs_client
from app.errors import DriverMisconfigured, DriverTransientError
from app.net_config import EcsDriverConfig
from tests.fixtures.aws import MOTO_REGION

pytestmark = pytest.mark.integration

CLUSTER = "flip-nets"
SERVICE = "fl-server-net-1"
ACCOUNT = "123456789012"  # moto's default account
TASK_DEFINITION_ARN = f"arn:aws:ecs:{MOTO_REGION}:{ACCOUNT}:task-definition/fl-server:7"


def _config(endpoint: str, cluster: str = CLUSTER, service: str = SERVICE) -> EcsDriverConfig:
    return EcsDriverConfig(
        kind="ecs", region=MOTO_REGION, cluster=cluster, service=service, endpoint_url=endpoint
    )


@pytest.fixture
def ecs(moto_endpoint: str) -> Any:
    """A plain client for arranging and checking state, independent of the driver."""
    client = boto3.session.Session().client(
        "ecs", region_name=MOTO_REGION, endpoint_url=moto_endpoint
    )
    client.create_cluster(clusterName=CLUSTER)
    client.register_task_definition(
        family="fl-server",
        requiresCompatibilities=["FARGATE"],
        networkMode="awsvpc",
        cpu="2048",
        memory="8192",
        containerDefinitions=[{"name": "fl-server", "image": "nvflare:2.9", "essential": True}],
    )
    return client


def _create_service(ecs: Any, desired: int, name: str = SERVICE) -> None:
    ecs.create_service(
        cluster=CLUSTER,
        serviceName=name,
        taskDefinition="fl-server",
        desiredCount=desired,
        launchType="FARGATE",
    )


@pytest.fixture
def stopped_service(ecs: Any) -> None:
    _create_service(ecs, desired=0)


@pytest.fixture
def driver(moto_endpoint: str, stopped_service: None) -> EcsDriver:
    return EcsDriver(_config(moto_endpoint))


class CallCounter:
    """Counts API calls as the real client makes them, via botocore's event hooks."""

    def __init__(self, client: Any) -> None:
        self.calls: list[str] = []
        client.meta.events.register("before-call.ecs.*", self._record)

    def _record(self, model: Any, **_: Any) -> None:
        self.calls.append(model.name)

    def count(self, operation: str) -> int:
        return self.calls.count(operation)


def _desired_count(ecs: Any) -> int:
    service = ecs.describe_services(cluster=CLUSTER, services=[SERVICE])["services"][0]
    return int(service["desiredCount"])


def test_scale_up_then_down_is_what_ecs_stores(driver: EcsDriver, ecs: Any) -> None:
    assert driver.observe() == Observation(desired=0, running=0, pending=0)

    driver.scale(1)
    assert _desired_count(ecs) == 1
    observed = driver.observe()
    assert observed == Observation(desired=1, running=1, pending=0)
    assert observed.is_up

    driver.scale(0)
    assert _desired_count(ecs) == 0
    assert driver.observe() == Observation(desired=0, running=0, pending=0)


def test_scale_to_the_current_count_makes_no_update_call(driver: EcsDriver) -> None:
    counter = CallCounter(driver.client)

    driver.scale(1)
    driver.scale(1)
    assert counter.count("UpdateService") == 1

    driver.scale(0)
    driver.scale(0)
    assert counter.count("UpdateService") == 2
    assert counter.count("DescribeServices") == 4


def test_pending_phase_from_moto(
    moto_endpoint: str, ecs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # moto's knob: MOTO_ECS_SERVICE_RUNNING is read (in this process: the server is a
    # thread) when a service is created; 0 running out of 1 desired = one pending task.
    monkeypatch.setenv("MOTO_ECS_SERVICE_RUNNING", "0")
    _create_service(ecs, desired=1)
    driver = EcsDriver(_config(moto_endpoint))
    counter = CallCounter(driver.client)

    observed = driver.observe()
    assert observed == Observation(desired=1, running=0, pending=1, failure=None)
    assert not observed.is_up

    # Scaling up while the task is still starting must not issue another UpdateService.
    driver.scale(1)
    assert counter.count("UpdateService") == 0


def test_a_service_given_by_its_arn_is_observed_and_scaled(
    moto_endpoint: str, stopped_service: None, ecs: Any
) -> None:
    """app/README.md: the cluster and service "by name or ARN". ECS answers DescribeServices
    by serviceName: a driver that looked its answer up by the ARN it asked with found none
    (DriverMisconfigured) and the net went MISCONFIGURED."""
    arn = ecs.describe_services(cluster=CLUSTER, services=[SERVICE])["services"][0]["serviceArn"]
    cluster_arn = ecs.describe_clusters(clusters=[CLUSTER])["clusters"][0]["clusterArn"]
    driver = EcsDriver(_config(moto_endpoint, cluster=cluster_arn, service=arn))

    assert driver.observe() == Observation(desired=0, running=0, pending=0)
    driver.scale(1)
    [service] = ecs.describe_services(cluster=CLUSTER, services=[SERVICE])["services"]
    assert service["desiredCount"] == 1


def test_missing_service_is_misconfigured(moto_endpoint: str, ecs: Any) -> None:
    driver = EcsDriver(_config(moto_endpoint, service="no-such-service"))

    with pytest.raises(DriverMisconfigured, match=r"no-such-service.*MISSING"):
        driver.observe()
    with pytest.raises(DriverMisconfigured, match="MISSING"):
        driver.scale(1)


def test_missing_cluster_is_misconfigured(moto_endpoint: str, ecs: Any) -> None:
    driver = EcsDriver(_config(moto_endpoint, cluster="no-such-cluster"))

    with pytest.raises(DriverMisconfigured, match="ClusterNotFoundException") as raised:
        driver.observe()
    assert isinstance(raised.value.__cause__, ClientError)
    with pytest.raises(DriverMisconfigured, match="ClusterNotFoundException"):
        driver.scale(0)


def test_inactive_service_is_misconfigured(driver: EcsDriver, ecs: Any) -> None:
    # moto keeps a deleted service, marked INACTIVE, as ECS does for a while.
    ecs.delete_service(cluster=CLUSTER, service=SERVICE)
    counter = CallCounter(driver.client)

    with pytest.raises(DriverMisconfigured, match="INACTIVE"):
        driver.observe()
    with pytest.raises(DriverMisconfigured, match="INACTIVE"):
        driver.scale(1)
    assert counter.count("UpdateService") == 0


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_endpoint_is_transient_after_botocore_retries(
    aws_credentials: None, closed_port: int
) -> None:
    config = _config(f"http://127.0.0.1:{closed_port}")
    # Short but real: botocore's standard mode retries once, then gives up.
    fast = Config(
        retries={"mode": "standard", "max_attempts": 1}, connect_timeout=1, read_timeout=1
    )
    driver = EcsDriver(config, client=make_ecs_client(config, fast))
    sends: list[str] = []
    driver.client.meta.events.register(
        "before-send.ecs.*", lambda request, **_: sends.append(request.url)
    )

    with pytest.raises(DriverTransientError, match="EndpointConnectionError") as raised:
        driver.observe()
    assert isinstance(raised.value.__cause__, EndpointConnectionError)
    assert len(sends) == 2  # the first attempt and botocore's one retry
    assert "testing" not in str(raised.value)  # the dummy credentials never reach a message

    with pytest.raises(DriverTransientError):
        driver.scale(1)


# A DescribeServices answer as ECS gives it once the deployment circuit breaker has given
# up on a rollout (tasks kept failing to start), before any rollback finishes.
def _recorded_service(status: str = "ACTIVE", rollout_state: str = "FAILED") -> dict[str, Any]:
    when = dt.datetime(2025, 3, 4, 10, 15, tzinfo=dt.UTC)
    arn = f"arn:aws:ecs:{MOTO_REGION}:{ACCOUNT}:service/{CLUSTER}/{SERVICE}"
    return {
        "services": [
            {
                "serviceArn": arn,
                "serviceName": SERVICE,
                "clusterArn": f"arn:aws:ecs:{MOTO_REGION}:{ACCOUNT}:cluster/{CLUSTER}",
                "status": status,
                "desiredCount": 1,
                "runningCount": 0,
                "pendingCount": 0,
                "launchType": "FARGATE",
                "taskDefinition": TASK_DEFINITION_ARN,
                "deploymentConfiguration": {
                    "deploymentCircuitBreaker": {"enable": True, "rollback": False},
                    "maximumPercent": 200,
                    "minimumHealthyPercent": 100,
                },
                "deployments": [
                    {
                        "id": "ecs-svc/4916254383812346811",
                        "status": "PRIMARY",
                        "taskDefinition": TASK_DEFINITION_ARN,
                        "desiredCount": 1,
                        "pendingCount": 0,
                        "runningCount": 0,
                        "failedTasks": 3,
                        "createdAt": when,
                        "updatedAt": when,
                        "launchType": "FARGATE",
                        "platformVersion": "1.4.0",
                        "rolloutState": rollout_state,
                        "rolloutStateReason": (
                            "ECS deployment circuit breaker: tasks failed to start."
                            if rollout_state == "FAILED"
                            else "ECS deployment ecs-svc/4916254383812346811 in progress."
                        ),
                    }
                ],
                "events": [],
                "createdAt": when,
                "schedulingStrategy": "REPLICA",
            }
        ],
        "failures": [],
    }


@pytest.fixture
def stubbed(moto_endpoint: str) -> Iterator[tuple[EcsDriver, Stubber]]:
    """A driver on a real client whose DescribeServices answers come from a recording."""
    driver = EcsDriver(_config(moto_endpoint))
    with Stubber(driver.client) as stubber:
        yield driver, stubber
        stubber.assert_no_pending_responses()


def test_circuit_breaker_failed_deployment_is_reported(
    stubbed: tuple[EcsDriver, Stubber],
) -> None:
    driver, stubber = stubbed
    expected = {"cluster": CLUSTER, "services": [SERVICE]}
    stubber.add_response("describe_services", _recorded_service(), expected)

    assert driver.observe() == Observation(
        desired=1,
        running=0,
        pending=0,
        failure="deployment FAILED: ECS deployment circuit breaker: tasks failed to start.",
    )


def test_pending_phase_from_a_recorded_response(stubbed: tuple[EcsDriver, Stubber]) -> None:
    driver, stubber = stubbed
    recorded = _recorded_service(rollout_state="IN_PROGRESS")
    recorded["services"][0].update(runningCount=0, pendingCount=1)
    stubber.add_response("describe_services", recorded)

    assert driver.observe() == Observation(desired=1, running=0, pending=1, failure=None)


def test_draining_service_is_misconfigured(stubbed: tuple[EcsDriver, Stubber]) -> None:
    driver, stubber = stubbed
    stubber.add_response("describe_services", _recorded_service(status="DRAINING"))

    with pytest.raises(DriverMisconfigured, match="DRAINING"):
        driver.scale(0)
