"""The error classes every adapter maps its failures into, decided once here.

Tasks retry only `TransientError`; a `MisconfigurationError` fails fast and loud; an
`InvalidRequest` is the caller's mistake and writes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence


class DispatcherError(Exception):
    """Base of every error fl-dispatcher raises on purpose."""


class TransientError(DispatcherError):
    """Worth retrying: the outside world may be fine again in a moment."""


class ServerUnavailable(TransientError):
    """The net's fl-server cannot be reached or is still starting."""


class UnknownAdminError(TransientError):
    """An nvflare error nobody classified: retried, but logged with its cause and counted."""


class DriverTransientError(TransientError):
    """The scale driver's platform throttled, timed out or was unreachable."""


class BundleTransientError(TransientError):
    """S3 throttled, failed (5xx), timed out, was unreachable or saw expired credentials
    while a job bundle was listed or downloaded; the step retries, the job is not failed."""


class MisconfigurationError(DispatcherError):
    """Fatal until a human fixes settings: never tolerated as "server down"."""


class AdminMisconfigured(MisconfigurationError):
    """Admin kit missing, unreadable, rejected, or pointing at another server or CA."""


class FilesNameAnotherServer(AdminMisconfigured):
    """Nothing sent: a worker start found the net's files naming another server (a verdict
    kept while a job holds the net, or this process's own files)."""


class DriverMisconfigured(MisconfigurationError):
    """The scale driver's target (service, cluster, kit) is missing or access is denied."""


class SettingsError(MisconfigurationError):
    """Settings failed validation at start; the message names the variable or net and field."""


class InvalidRequest(DispatcherError):
    """A caller's request is wrong (bad payload, unknown net, definition outside its root)."""


class CallerKeyConflict(InvalidRequest):
    """The caller_key already names a job that was enqueued with a different payload: no new
    job, the existing one unchanged (reason code `caller_key_conflict`; HTTP 409)."""


class NetMisconfigured(InvalidRequest):
    """The request needs a net that is MISCONFIGURED (an operator must fix its settings
    first): nothing was started (prewarm reason code `net_misconfigured`; HTTP 409)."""

    def __init__(self, message: str, net_name: str | None = None) -> None:
        super().__init__(message)
        self.net_name = net_name


class NetDrained(InvalidRequest):
    """The request needs a net an operator has drained (before a redeploy): nothing was
    started, nothing held (prewarm reason code `net_drained`; HTTP 409)."""

    def __init__(self, message: str, net_name: str | None = None) -> None:
        super().__init__(message)
        self.net_name = net_name


class NotFound(DispatcherError):
    """The job or net named by a caller does not exist."""


class RequestRejected(NotFound):
    """No such job because the enqueue that would have created it was refused (the reason
    is kept for REJECTED_RETENTION_S), with its reason code (models.reasons)."""

    def __init__(self, message: str, reason_code: str = "rejected") -> None:
        super().__init__(message)
        self.reason_code = reason_code


class JobOutcomeError(DispatcherError):
    """A job-level answer from the server that is not a connection problem."""


class NvflareJobNotFound(JobOutcomeError):
    """The server does not know this NVFLARE job id."""


class NvflareJobNotRunning(JobOutcomeError):
    """The server knows the job but it is not running (so nothing to abort)."""


class BundleUnavailable(JobOutcomeError):
    """The job's S3 bundle cannot be used: no bucket, no objects, access denied, an unsafe
    key, or over a size or file-count cap. Retrying cannot help, so the job fails at once."""


class BundleMissing(BundleUnavailable):
    """The job's bundle is not there: no bucket, no objects under the prefix, or a local
    job folder gone from the job root."""


class BundleTooLarge(BundleUnavailable):
    """The bundle is over S3_MAX_BUNDLE_BYTES or S3_MAX_BUNDLE_FILES."""


# How much of a caller's value an error message quotes: enough to recognise a typo.
QUOTE_MAX_CHARS = 80
# Characters quoted as they are; any other is escaped: no markup, quote, control or
# non-ASCII character a caller sent comes back in a message (an API answer, a log line).
_PLAIN_CHARACTERS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 !#$%()*+,-./:;=?@[]^_`{|}~"
)


def quoted(value: str) -> str:
    """A caller's value as an error message quotes it: in single quotes, at most
    QUOTE_MAX_CHARS characters (then `...` and the value's length), every character but
    printable ASCII without `<>&"'\\` escaped (`\\x3c`, `\\u00e9`); a plain value as `repr`."""
    head = "".join(c if c in _PLAIN_CHARACTERS else _escaped(c) for c in value[:QUOTE_MAX_CHARS])
    more = f"... ({len(value)} characters)" if len(value) > QUOTE_MAX_CHARS else ""
    return f"'{head}'{more}"


def field_name(part: object) -> str:
    """A field name or index a message names: as it is when it reads as one (letters,
    digits, `_.-`, at most 80), else `quoted` (a key the caller made up)."""
    text = str(part)
    return text if _FIELD_NAME.fullmatch(text) else quoted(text)


_FIELD_NAME = re.compile(r"[A-Za-z0-9_.-]{1,80}")


def quoted_all(values: Sequence[str], limit: int = 10) -> str:
    """A caller's values as an error message lists them: each `quoted`, the first `limit`
    of them in brackets (then how many more): `['site-1', 'site-9']` for plain ones."""
    shown = ", ".join(quoted(value) for value in values[:limit])
    more = f", ... ({len(values) - limit} more)" if len(values) > limit else ""
    return f"[{shown}{more}]"


def _escaped(character: str) -> str:
    code = ord(character)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
