"""The `ecs` scale driver: a net's fl-server is an ECS service scaled between 0 and 1 task.

Two API calls only, `DescribeServices` and `UpdateService(desiredCount)`, so the IAM policy
can be limited to those two actions on the net's service ARN (`iam_policy_for`, shipped as
`app/policies/ecs-scale-policy.json`). Credentials come from boto3's standard chain (task
role, env, profile); nothing here reads or logs them.

Retries of throttling, 5xx and connection errors are botocore's own ("standard" mode, with
its exponential backoff and jitter); what is still failing after them is classified once,
in `_classify`, into DriverTransientError (the task retries or requeues) or
DriverMisconfigured (fatal, loud), with the botocore exception kept as `__cause__`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NoReturn

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    HTTPClientError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    PartialCredentialsError,
    ValidationError,
)
from botocore.exceptions import ConnectionError as BotocoreConnectionError

from app.adapters.drivers.base import Observation
from app.errors import DriverMisconfigured, DriverTransientError
from app.settings import EcsDriverConfig, NetConfig

if TYPE_CHECKING:
    from mypy_boto3_ecs.client import ECSClient
    from mypy_boto3_ecs.type_defs import ServiceTypeDef

log = logging.getLogger(__name__)

# botocore retries each call up to this many times (after the first attempt) with backoff
# and jitter before we see the error; the Celery task's own retry adds the long tail.
ECS_MAX_RETRY_ATTEMPTS = 4
ECS_CONNECT_TIMEOUT_S = 5.0
ECS_READ_TIMEOUT_S = 15.0

POLICY_VERSION = "2012-10-17"
POLICY_ACTIONS = ("ecs:DescribeServices", "ecs:UpdateService")

# Error codes that mean "the platform is busy or broken right now", should they survive
# botocore's own retries. Anything else with a 4xx status is a request that will keep
# failing the same way until a human changes settings or IAM.
_TRANSIENT_CODES = frozenset(
    {
        "ServerException",  # ECS's 5xx
        "InternalFailure",
        "InternalError",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
    }
)

# Access key ids, and the signature parts some auth errors echo back from the request.
_SECRET_PATTERNS = (
    re.compile(r"\b(?:AKIA|ASIA|AROA|AIDA)[A-Z0-9]{12,}\b"),
    re.compile(r"(?i)(credential|signature|x-amz-security-token|securitytoken)=[^\s,&'\"]+"),
)
_MAX_DETAIL_CHARS = 300


def default_botocore_config() -> Config:
    """Timeouts and botocore's "standard" retry mode, the same for every ECS net."""
    return Config(
        retries={"mode": "standard", "max_attempts": ECS_MAX_RETRY_ATTEMPTS},
        connect_timeout=ECS_CONNECT_TIMEOUT_S,
        read_timeout=ECS_READ_TIMEOUT_S,
    )


def make_ecs_client(config: EcsDriverConfig, botocore_config: Config | None = None) -> ECSClient:
    """An ECS client for the net's region (and moto's endpoint in tests)."""
    # A session of our own: boto3's default session is shared module state and creating
    # clients from it is not thread-safe; the client itself is.
    session = boto3.session.Session()
    return session.client(
        "ecs",
        region_name=config.region,
        endpoint_url=config.endpoint_url,
        config=botocore_config or default_botocore_config(),
    )


class EcsDriver:
    """Scales one net's fl-server ECS service between 0 and 1 task."""

    kind = "ecs"

    def __init__(self, config: EcsDriverConfig, *, client: ECSClient | None = None) -> None:
        self.config = config
        self.client = client if client is not None else make_ecs_client(config)

    @property
    def target(self) -> str:
        """How errors and logs name the service: region, cluster and service."""
        return f"ECS service {self.config.cluster}/{self.config.service} in {self.config.region}"

    def scale(self, replicas: int) -> None:
        """Set desiredCount to `replicas`; no UpdateService call if it already is."""
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        # Read-then-write is safe here: the write sets an absolute count, and the use cases
        # serialize scale calls per net on the net's row lock.
        service = self._describe()
        if service.get("desiredCount") == replicas:
            log.debug("%s already has desiredCount=%d", self.target, replicas)
            return
        log.info("%s: desiredCount %s -> %d", self.target, service.get("desiredCount"), replicas)
        try:
            self.client.update_service(
                cluster=self.config.cluster, service=self.config.service, desiredCount=replicas
            )
        except (ClientError, BotoCoreError) as exc:
            _classify(exc, "UpdateService", self.target)

    def observe(self) -> Observation:
        """Desired/running/pending from the service; a FAILED deployment becomes `failure`."""
        service = self._describe()
        return Observation(
            desired=service.get("desiredCount", 0),
            running=service.get("runningCount", 0),
            pending=service.get("pendingCount", 0),
            failure=_deployment_failure(service),
        )

    def _describe(self) -> ServiceTypeDef:
        try:
            response = self.client.describe_services(
                cluster=self.config.cluster, services=[self.config.service]
            )
        except (ClientError, BotoCoreError) as exc:
            _classify(exc, "DescribeServices", self.target)
        for failure in response.get("failures", []):
            reason = failure.get("reason", "unknown")
            detail = f" ({_redact(failure['detail'])})" if failure.get("detail") else ""
            raise DriverMisconfigured(f"{self.target}: DescribeServices says {reason}{detail}")
        services = response.get("services", [])
        if not services:
            raise DriverMisconfigured(f"{self.target}: DescribeServices returned no service")
        service = services[0]
        status = service.get("status", "")
        # DRAINING: being deleted; INACTIVE: deleted. Neither will run a task again, and
        # UpdateService on them fails, so this is a settings problem, not a wait.
        if status in ("INACTIVE", "DRAINING"):
            raise DriverMisconfigured(
                f"{self.target} is {status} (deleted or being deleted); "
                "point the net at an ACTIVE service"
            )
        return service


def _deployment_failure(service: ServiceTypeDef) -> str | None:
    """The reason of a deployment the ECS circuit breaker marked FAILED, if any."""
    # The PRIMARY deployment decides the service's future; an ACTIVE one that failed (the
    # circuit breaker is rolling back from it) is still worth reporting while it drains.
    # An INACTIVE one is history.
    deployments = [d for d in service.get("deployments", []) if d.get("status") != "INACTIVE"]
    ordered = sorted(deployments, key=lambda d: d.get("status") != "PRIMARY")
    for deployment in ordered:
        if deployment.get("rolloutState") == "FAILED":
            reason = _redact(deployment.get("rolloutStateReason", "") or "no reason given")
            return f"deployment FAILED: {reason}"
    return None


def _classify(exc: ClientError | BotoCoreError, operation: str, target: str) -> NoReturn:
    """Raise the dispatcher's error class for a botocore failure, keeping it as __cause__."""
    if isinstance(exc, ClientError):
        error: Any = exc.response.get("Error", {})
        code = str(error.get("Code", "Unknown"))
        detail = _redact(str(error.get("Message", "")))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        message = f"{target}: {operation} failed: {code}: {detail}".rstrip(": ")
        if code in _TRANSIENT_CODES or status >= 500 or status == 429:
            raise DriverTransientError(message) from exc
        # ClusterNotFound, ServiceNotFound, ServiceNotActive, AccessDenied,
        # InvalidParameter, ClientException, UnrecognizedClient, ExpiredToken, ...
        raise DriverMisconfigured(message) from exc
    kind = type(exc).__name__
    if isinstance(exc, BotocoreConnectionError | HTTPClientError):
        # Endpoint unreachable, connect/read timeout, connection reset: botocore already
        # retried these; the task backs off and tries again later.
        raise DriverTransientError(f"{target}: {operation}: {kind}: {_redact(str(exc))}") from exc
    if isinstance(
        exc,
        NoCredentialsError
        | PartialCredentialsError
        | NoRegionError
        | ValidationError
        | ParamValidationError,
    ):
        raise DriverMisconfigured(f"{target}: {operation}: {kind}: {_redact(str(exc))}") from exc
    if isinstance(exc, CredentialRetrievalError):
        # The credential source (IMDS, container endpoint, SSO) failed to answer: the
        # settings may be fine, so this is worth a retry. Its message names the provider only.
        raise DriverTransientError(f"{target}: {operation}: {kind}: {_redact(str(exc))}") from exc
    # A botocore error nobody classified: retried (the task's retries are capped), but
    # logged with its type so it gets a proper class.
    log.warning("%s: unclassified botocore error %s in %s", target, kind, operation)
    raise DriverTransientError(f"{target}: {operation}: {kind}: {_redact(str(exc))}") from exc


def _redact(text: str) -> str:
    """Drop anything that looks like a credential and cap the length."""
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(
            lambda m: f"{m.group(1)}=***" if m.groups() else "***",
            text,
        )
    if len(text) > _MAX_DETAIL_CHARS:
        text = text[:_MAX_DETAIL_CHARS] + "..."
    return text


def _partition(region: str) -> str:
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def service_arn(config: EcsDriverConfig, account_id: str) -> str:
    """The long-format service ARN that IAM matches UpdateService/DescribeServices against."""
    return (
        f"arn:{_partition(config.region)}:ecs:{config.region}:{account_id}:"
        f"service/{config.cluster}/{config.service}"
    )


def iam_policy_for(nets: Iterable[NetConfig], account_id: str) -> dict[str, Any]:
    """The least-privilege IAM policy for the dispatcher: DescribeServices and UpdateService
    on exactly the service ARNs of the configured ECS nets, nothing else."""
    resources = sorted(
        {
            service_arn(net.driver, account_id)
            for net in nets
            if isinstance(net.driver, EcsDriverConfig)
        }
    )
    if not resources:
        raise ValueError("no net uses the ecs driver, so no ECS policy is needed")
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            {
                "Sid": "ScaleFlServers",
                "Effect": "Allow",
                "Action": list(POLICY_ACTIONS),
                "Resource": resources,
            }
        ],
    }
