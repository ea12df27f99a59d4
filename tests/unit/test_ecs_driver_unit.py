"""How EcsDriver classifies what ECS answers, without a network.

A real ECS client (real service model, real parameter and response validation) with
botocore's Stubber answering in place of the endpoint; the Stubber short-circuits before
the request is signed or sent, so nothing leaves the process. The moto-backed behaviour
(scale, observe, missing service or cluster, unreachable endpoint) is in
tests/integration/test_ecs_driver.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, NoCredentialsError
from botocore.stub import Stubber

from app.adapters.drivers.ecs import EcsDriver, make_ecs_client
from app.errors import DriverMisconfigured, DriverTransientError
from app.net_config import EcsDriverConfig

CONFIG = EcsDriverConfig(
    kind="ecs",
    region="eu-west-2",
    cluster="flip",
    service="fl-server-1",
    endpoint_url="http://127.0.0.1:9",  # never contacted: the Stubber answers first
)
DESCRIBE = {"cluster": "flip", "services": ["fl-server-1"]}
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
ACCESS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"


def _service(desired: int, status: str = "ACTIVE", **extra: Any) -> dict[str, Any]:
    return {
        "services": [
            {
                "serviceName": "fl-server-1",
                "status": status,
                "desiredCount": desired,
                "runningCount": desired,
                "pendingCount": 0,
                **extra,
            }
        ],
        "failures": [],
    }


@pytest.fixture(scope="module")
def session() -> boto3.session.Session:
    # One session for the module: it caches the loaded ECS model, so clients come cheap.
    return boto3.session.Session(aws_access_key_id=ACCESS_KEY_ID, aws_secret_access_key=SECRET)


@pytest.fixture
def stubbed(session: boto3.session.Session) -> Iterator[tuple[EcsDriver, Stubber]]:
    client = session.client("ecs", region_name=CONFIG.region, endpoint_url=CONFIG.endpoint_url)
    driver = EcsDriver(CONFIG, client=client)
    with Stubber(client) as stubber:
        yield driver, stubber
        stubber.assert_no_pending_responses()


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("ThrottlingException", 400),
        ("ServerException", 500),
        ("ServiceUnavailable", 503),
        ("SomethingNewAndBroken", 502),
        ("TooManyRequestsException", 429),
    ],
)
def test_throttling_and_server_errors_are_transient(
    stubbed: tuple[EcsDriver, Stubber], code: str, status: int
) -> None:
    driver, stubber = stubbed
    stubber.add_client_error("describe_services", code, "try later", status, DESCRIBE)

    with pytest.raises(DriverTransientError, match=code) as raised:
        driver.observe()
    assert isinstance(raised.value.__cause__, ClientError)


@pytest.mark.parametrize(
    "code",
    [
        "AccessDeniedException",
        "InvalidParameterException",
        "ClientException",
        "ServiceNotActiveException",
        "ServiceNotFoundException",
        "UnrecognizedClientException",
        "ExpiredTokenException",
    ],
)
def test_client_errors_are_misconfiguration(stubbed: tuple[EcsDriver, Stubber], code: str) -> None:
    driver, stubber = stubbed
    stubber.add_response("describe_services", _service(desired=0), DESCRIBE)
    stubber.add_client_error("update_service", code, "no", 400)

    with pytest.raises(DriverMisconfigured, match=f"UpdateService failed: {code}") as raised:
        driver.scale(1)
    assert isinstance(raised.value.__cause__, ClientError)


def test_a_throttled_update_is_transient(stubbed: tuple[EcsDriver, Stubber]) -> None:
    driver, stubber = stubbed
    stubber.add_response("describe_services", _service(desired=0), DESCRIBE)
    stubber.add_client_error(
        "update_service",
        "ThrottlingException",
        "Rate exceeded",
        400,
        {"cluster": "flip", "service": "fl-server-1", "desiredCount": 1},
    )

    with pytest.raises(DriverTransientError, match="Rate exceeded"):
        driver.scale(1)


def test_error_messages_never_carry_credentials(stubbed: tuple[EcsDriver, Stubber]) -> None:
    driver, stubber = stubbed
    echoed = (
        "User: arn:aws:sts::123456789012:assumed-role/dispatcher/i-0abc is not authorized "
        f"to perform: ecs:DescribeServices. Credential={ACCESS_KEY_ID}/20250304/eu-west-2/ecs"
        f"/aws4_request, Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        f" key {ACCESS_KEY_ID}"
    )
    stubber.add_client_error("describe_services", "AccessDeniedException", echoed, 400)

    with pytest.raises(DriverMisconfigured) as raised:
        driver.observe()
    message = str(raised.value)
    assert "not authorized to perform: ecs:DescribeServices" in message
    assert ACCESS_KEY_ID not in message
    assert SECRET not in message
    assert "5d672d79" not in message


def test_a_failure_other_than_missing_is_misconfiguration(
    stubbed: tuple[EcsDriver, Stubber],
) -> None:
    driver, stubber = stubbed
    stubber.add_response(
        "describe_services",
        {
            "services": [],
            "failures": [{"arn": "arn:aws:ecs:...", "reason": "ACCESS_DENIED", "detail": "x"}],
        },
    )

    with pytest.raises(DriverMisconfigured, match=r"ACCESS_DENIED \(x\)"):
        driver.observe()


def test_a_failed_primary_deployment_wins_over_history(stubbed: tuple[EcsDriver, Stubber]) -> None:
    driver, stubber = stubbed
    deployments = [
        {"status": "INACTIVE", "rolloutState": "FAILED", "rolloutStateReason": "old news"},
        {"status": "ACTIVE", "rolloutState": "FAILED", "rolloutStateReason": "rolling back"},
        {"status": "PRIMARY", "rolloutState": "FAILED", "rolloutStateReason": "tasks failed"},
    ]
    stubber.add_response("describe_services", _service(desired=1, deployments=deployments))
    stubber.add_response("describe_services", _service(desired=1, deployments=deployments[:2]))
    stubber.add_response("describe_services", _service(desired=1, deployments=deployments[:1]))

    assert driver.observe().failure == "deployment FAILED: tasks failed"
    assert driver.observe().failure == "deployment FAILED: rolling back"
    assert driver.observe().failure is None


def test_negative_replicas_are_a_bug(stubbed: tuple[EcsDriver, Stubber]) -> None:
    driver, _ = stubbed
    with pytest.raises(ValueError, match="replicas"):
        driver.scale(-1)


def test_no_credentials_anywhere_is_misconfiguration(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    driver = EcsDriver(CONFIG, client=make_ecs_client(CONFIG))

    # Signing fails before any connection is attempted.
    with pytest.raises(DriverMisconfigured, match="NoCredentialsError") as raised:
        driver.observe()
    assert isinstance(raised.value.__cause__, NoCredentialsError)
