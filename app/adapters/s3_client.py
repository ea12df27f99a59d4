"""Talking to S3: the client (credentials and region only from boto3's default chain, timeouts,
botocore's "standard" retries) and the one classification of its failures: throttling, 5xx,
connection problems and expired credentials are `BundleTransientError` (the task retries); a
missing bucket or prefix, access denied or an unusable request is `BundleUnavailable` (the job
fails at once). Messages carry the S3 error code, the operation and the bucket/prefix, never
a credential or a response body."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NoReturn

from app.errors import BundleMissing, BundleTransientError, BundleUnavailable

if TYPE_CHECKING:
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError
    from mypy_boto3_s3.client import S3Client

    from app.adapters.s3_definition import S3Definition

log = logging.getLogger(__name__)

# botocore retries each call up to this many times after the first attempt ("standard"
# mode: throttling, 5xx, connection errors, with backoff and jitter); the Celery task's
# retry adds the long tail.
S3_MAX_ATTEMPTS = 4
S3_CONNECT_TIMEOUT_S = 5.0
S3_READ_TIMEOUT_S = 30.0


# S3 error codes worth a retry should they survive botocore's own retries. Expired
# credentials are here because boto3's chain refreshes them: the next attempt signs anew.
_TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "ExpiredToken",
        "ExpiredTokenException",
        "RequestExpired",
        "TokenRefreshRequired",
    }
)
# Answers to a GET of a key the listing just returned: the bundle changed under us. The
# next attempt lists again and decides on the new content (a deleted bundle then fails).
_CHANGED_CODES = frozenset({"NoSuchKey", "PreconditionFailed"})
_HINTS = {
    "NoSuchBucket": "the bucket does not exist",
    "AccessDenied": "the worker's AWS identity may not read this bucket/prefix",
    "AllAccessDisabled": "all access to this bucket is disabled",
    "InvalidAccessKeyId": "the worker's AWS access key is not known to S3",
    "SignatureDoesNotMatch": "the worker's AWS secret key does not match its access key",
    "InvalidObjectState": "an object is archived (Glacier); restore it first",
}


def default_botocore_config() -> Config:
    """Timeouts and botocore's "standard" retry mode for every S3 call."""
    from botocore.config import Config

    return Config(
        retries={"mode": "standard", "max_attempts": S3_MAX_ATTEMPTS},
        connect_timeout=S3_CONNECT_TIMEOUT_S,
        read_timeout=S3_READ_TIMEOUT_S,
    )


def make_s3_client(
    endpoint_url: str | None = None, botocore_config: Config | None = None
) -> S3Client:
    """An S3 client with credentials and region from boto3's default chain only."""
    import boto3

    # A session of our own: boto3's default session is shared module state and creating
    # clients from it is not thread-safe; the client itself is.
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url, config=botocore_config or default_botocore_config()
    )


def raise_classified(
    exc: ClientError | BotoCoreError, bundle_def: S3Definition, operation: str
) -> NoReturn:
    """Raise BundleTransientError or BundleUnavailable for a botocore failure."""
    from botocore.exceptions import (
        ClientError,
        ConnectionClosedError,
        CredentialRetrievalError,
        HTTPClientError,
        IncompleteReadError,
        NoCredentialsError,
        ParamValidationError,
        PartialCredentialsError,
    )
    from botocore.exceptions import ConnectionError as BotocoreConnectionError

    where = f"{bundle_def.uri}: {operation}"
    if isinstance(exc, ClientError):
        # Only the code and the status: S3 error bodies can echo the access key id or the
        # string that was signed.
        code = str(exc.response.get("Error", {}).get("Code", "Unknown"))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if operation.startswith("GetObject") and code in _CHANGED_CODES:
            raise BundleTransientError(
                f"{where}: {code}: the bundle changed while downloading; will list again"
            ) from exc
        if code in _TRANSIENT_CODES or status >= 500 or status == 429:
            raise BundleTransientError(f"{where}: {code} (HTTP {status}); will retry") from exc
        hint = f": {_HINTS[code]}" if code in _HINTS else ""
        missing = BundleMissing if code in ("NoSuchBucket", "NoSuchKey") else BundleUnavailable
        raise missing(f"{where}: {code} (HTTP {status}){hint}") from exc
    kind = type(exc).__name__
    if isinstance(
        exc,
        BotocoreConnectionError
        | HTTPClientError
        | ConnectionClosedError
        | IncompleteReadError
        | CredentialRetrievalError,
    ):
        # Endpoint unreachable, timeouts, a stream cut short, a credential provider (IMDS,
        # container endpoint) not answering: botocore already retried what it could.
        raise BundleTransientError(f"{where}: {kind}; will retry") from exc
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        raise BundleUnavailable(
            f"{where}: {kind}: boto3's default chain found no usable AWS credentials"
        ) from exc
    if isinstance(exc, ParamValidationError):
        raise BundleUnavailable(f"{where}: {kind}: the request is invalid") from exc
    # Nobody classified it: retried (the task's retries are capped), and logged by type so
    # it gets a class.
    log.warning("unclassified botocore error %s in %s", kind, where)
    raise BundleTransientError(f"{where}: {kind}; will retry") from exc
