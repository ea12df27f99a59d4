"""The `ecs` scale driver: a net's fl-server is an ECS service scaled between 0 and 1 task.

Every net declared on the same cluster (same region and endpoint) shares one client and
one `EcsServiceGroup`: a process holds one boto3 session and service model per cluster, not
per net, and inside an observation pass (app.adapters.drivers.base) DescribeServices reads
up to 10 of the group's services in one call.

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

import functools
import logging
import os
import re
from collections.abc import Iterable, Sequence
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

from app.adapters.drivers.base import Observation, ObservationPass, current_pass
from app.errors import DispatcherError, DriverMisconfigured, DriverTransientError
from app.net_config import EcsDriverConfig, NetConfig
from app.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_ecs.client import ECSClient
    from mypy_boto3_ecs.type_defs import ServiceTypeDef

log = logging.getLogger(__name__)

# botocore retries each call up to this many times (after the first attempt) with backoff
# and jitter before we see the error; the Celery task's own retry adds the long tail.
ECS_MAX_RETRY_ATTEMPTS = 4
ECS_CONNECT_TIMEOUT_S = 5.0
ECS_READ_TIMEOUT_S = 15.0

# DescribeServices takes at most this many services per call.
DESCRIBE_BATCH = 10

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
    return _client(config.region, config.endpoint_url, botocore_config)


def _client(region: str, endpoint_url: str | None, botocore_config: Config | None) -> ECSClient:
    # A session of our own: boto3's default session is shared module state and creating
    # clients from it is not thread-safe; the client itself is.
    session = boto3.session.Session()
    return session.client(
        "ecs",
        region_name=region,
        endpoint_url=endpoint_url,
        config=botocore_config or default_botocore_config(),
    )


GroupKey = tuple[str, str | None, str]  # region, endpoint_url, cluster


def group_key(config: EcsDriverConfig) -> GroupKey:
    """Which services one DescribeServices call can read together."""
    return (config.region, config.endpoint_url, config.cluster)


class EcsServiceGroup:
    """The ECS services of one cluster (one region, one endpoint) that a process's nets
    use, in declaration order, behind one client."""

    def __init__(
        self,
        key: GroupKey,
        nets: Sequence[tuple[str, str]],
        *,
        client: ECSClient | None = None,
        botocore_config: Config | None = None,
    ) -> None:
        """`nets`: (net name, service) pairs in declaration order."""
        self.key = key
        self.region, endpoint_url, self.cluster = key
        self.services = tuple(dict.fromkeys(service for _, service in nets))
        self._position = {service: i for i, service in enumerate(self.services)}
        self._by_net = dict(nets)
        self.client = (
            client if client is not None else _client(self.region, endpoint_url, botocore_config)
        )

    def target(self, service: str) -> str:
        """How errors and logs name one service: region, cluster and service."""
        return f"ECS service {self.cluster}/{service} in {self.region}"

    def describe(self, services: Sequence[str]) -> dict[str, ServiceTypeDef | DispatcherError]:
        """One DescribeServices call for up to 10 services. A service's own problem (missing,
        deleted) is its entry; a call that fails as a whole raises, classified."""
        if not 0 < len(services) <= DESCRIBE_BATCH:
            raise ValueError(f"DescribeServices takes 1 to {DESCRIBE_BATCH} services")
        target = (
            self.target(services[0])
            if len(services) == 1
            else f"ECS services {self.cluster}/{{{','.join(services)}}} in {self.region}"
        )
        try:
            response = self.client.describe_services(cluster=self.cluster, services=[*services])
        except (ClientError, BotoCoreError) as exc:
            _classify(exc, "DescribeServices", target)
        found: dict[str, ServiceTypeDef | DispatcherError] = {}
        for failure in response.get("failures", []):
            name = failure.get("arn", "").rsplit("/", 1)[-1]
            if name not in services and len(services) == 1:
                name = services[0]
            reason = failure.get("reason", "unknown")
            detail = f" ({_redact(failure['detail'])})" if failure.get("detail") else ""
            found[name] = DriverMisconfigured(
                f"{self.target(name)}: DescribeServices says {reason}{detail}"
            )
        for service in response.get("services", []):
            name = service.get("serviceName", "")
            status = service.get("status", "")
            # DRAINING: being deleted; INACTIVE: deleted. Neither will run a task again, and
            # UpdateService on them fails, so this is a settings problem, not a wait.
            found[name] = (
                DriverMisconfigured(
                    f"{self.target(name)} is {status} (deleted or being deleted); "
                    "point the net at an ACTIVE service"
                )
                if status in ("INACTIVE", "DRAINING")
                else service
            )
        return {
            name: found[name]
            if name in found
            else DriverMisconfigured(f"{self.target(name)}: DescribeServices returned no service")
            for name in services
        }

    def describe_one(self, service: str) -> ServiceTypeDef:
        """One service, read afresh; its problem raised."""
        found = self.describe([service])[service]
        if isinstance(found, DispatcherError):
            raise found
        return found

    def neighbours(self, service: str, within: ObservationPass, n: int) -> list[str]:
        """Up to `n` services a pass will want next and has not read yet: those of the nets
        it plans to observe (`within.order`) or, without a plan, the group's services after
        `service` in declaration order."""
        if within.order:
            planned = [s for s in (self._by_net.get(name) for name in within.order) if s]
        else:
            at = self._position.get(service, -1) + 1
            planned = [*self.services[at:], *self.services[:at]]
        picked: list[str] = []
        for other in planned:
            if len(picked) == n:
                break
            if other != service and other not in picked and not within.was_read((self.key, other)):
                picked.append(other)
        return picked


@functools.lru_cache(maxsize=32)
def _shared_group(pid: int, key: GroupKey, nets: tuple[tuple[str, str], ...]) -> EcsServiceGroup:
    # One per process (a forked child builds its own: clients are not fork-safe), cluster and
    # set of declared nets.
    del pid
    return EcsServiceGroup(key, nets)


def driver_for(net: NetConfig, settings: Settings) -> EcsDriver:
    """The net's driver, sharing its client and batches with every net declared on the
    same cluster."""
    config = net.driver
    if not isinstance(config, EcsDriverConfig):
        raise TypeError(f"net {net.name!r} does not use the ecs driver")
    key = group_key(config)
    members = tuple(
        (other.name, other.driver.service)
        for other in settings.nets
        if isinstance(other.driver, EcsDriverConfig) and group_key(other.driver) == key
    )
    return EcsDriver(config, group=_shared_group(os.getpid(), key, members))


def observed(service: ServiceTypeDef) -> Observation:
    """Desired/running/pending from a service; a FAILED deployment becomes `failure`."""
    return Observation(
        desired=service.get("desiredCount", 0),
        running=service.get("runningCount", 0),
        pending=service.get("pendingCount", 0),
        failure=_deployment_failure(service),
    )


class EcsDriver:
    """Scales one net's fl-server ECS service between 0 and 1 task."""

    kind = "ecs"

    def __init__(
        self,
        config: EcsDriverConfig,
        *,
        client: ECSClient | None = None,
        group: EcsServiceGroup | None = None,
    ) -> None:
        self.config = config
        # Alone, the driver is a group of one (its own client, or the one given).
        service = config.service
        self.group = group or EcsServiceGroup(
            group_key(config), [(service, service)], client=client
        )
        self.client = self.group.client
        self._key = (self.group.key, config.service)

    @property
    def target(self) -> str:
        """How errors and logs name the service: region, cluster and service."""
        return self.group.target(self.config.service)

    @property
    def batch_key(self) -> object:
        """Nets whose drivers share this key can be observed in one call (see
        Runtime.observation_batches)."""
        return ("ecs", id(self.group))

    def scale(self, replicas: int) -> None:
        """Set desiredCount to `replicas`; no UpdateService call if it already is."""
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        within = current_pass()
        if within is not None:
            within.forget(self._key)
        # Read-then-write is safe here: the write sets an absolute count, and the use cases
        # serialize scale calls per net on the net's row lock.
        service = self.group.describe_one(self.config.service)
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
        """Desired/running/pending from the service; a FAILED deployment becomes `failure`.
        In an observation pass, one DescribeServices call also reads up to 9 services the
        pass will want next, and what the pass holds for this one is used once."""
        within = current_pass()
        if within is None:
            return observed(self.group.describe_one(self.config.service))
        held = within.take(self._key)
        if isinstance(held, Observation):
            return held
        if isinstance(held, DispatcherError):
            raise held
        within.mark_read(self._key)
        batch = [
            self.config.service,
            *self.group.neighbours(self.config.service, within, DESCRIBE_BATCH - 1),
        ]
        if len(batch) > 1:
            try:
                found = self.group.describe(batch)
            except DispatcherError:
                # The call failed as a whole, perhaps for a neighbour's sake (IAM refusing
                # one service, say): this net is read alone, for its own answer or error.
                batch = [self.config.service]
            else:
                for other in batch[1:]:
                    value = found[other]
                    within.offer(
                        (self.group.key, other),
                        value if isinstance(value, DispatcherError) else observed(value),
                    )
                own = found[self.config.service]
                if isinstance(own, DispatcherError):
                    raise own
                return observed(own)
        return observed(self.group.describe_one(self.config.service))


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
