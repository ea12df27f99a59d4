"""One `Settings` for every process: worker, beat, status API, CLI.

Nothing else in the code reads `os.environ` (nor the settings file FL_DISPATCHER_ENV_FILE
names, read under it). Nets are declared once (`NETS_FILE` or inline
`NETS`) and validated in full when settings are built, so a net missing a field stops the
process at start instead of running half-configured.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.errors import SettingsError
from app.flags import parse_flag
from app.net_config import (
    MAX_SECONDS,
    NetConfig,
    format_validation_error,
    load_nets_file,
    parse_nets,
)
from app.project_shares import DEFAULT_AGING_S, MAX_AGING_S, Shares, parse_project_shares
from app.redact import redact_url
from app.secret_checks import check_api_secret, refuse_placeholders, url_password


# Mutation testing covers `_check_webhook_secret` only here (pyproject [tool.mutmut]; flags
# are parsed in app/flags.py): what follows is the pydantic declaration and its validators
# (decorated: mutmut skips them even unfenced), checked by test_settings.py case by case.
# The fence is a choice of scope, not an equivalence: it also holds plain decisions whose
# mutants no run tries (`report_timeout_for`, `has_net`, the URL helpers, `load_settings`).
# pragma: no mutate start
class Settings(BaseSettings):
    """Every setting of every process; built once at start and passed in."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True, env_ignore_empty=False)

    data_dir: Path = Field(default=Path(".fl-dispatcher"), alias="FL_DISPATCHER_DATA_DIR")
    database_url: str = Field(default="", alias="DATABASE_URL")
    broker_url: str = Field(default="", alias="BROKER_URL")
    per_job_fl_server: Annotated[bool, NoDecode] = Field(default=False, alias="PER_JOB_FL_SERVER")
    nets_file: Path | None = Field(default=None, alias="NETS_FILE")
    nets_inline: Annotated[str, NoDecode] = Field(default="", alias="NETS")
    # Filled from nets_file / nets_inline by the validator below; private so that no
    # environment variable can set it around the per-net validation.
    _nets: tuple[NetConfig, ...] = PrivateAttr(default=())
    _by_name: dict[str, NetConfig] = PrivateAttr(default_factory=dict)

    job_root: Path = Field(default=Path("jobs"), alias="JOB_ROOT")
    max_attempts: int = Field(default=3, ge=1, alias="MAX_ATTEMPTS")
    lost_job_policy: Literal["requeue", "fail"] = Field(default="requeue", alias="LOST_JOB_POLICY")
    max_run_s: float = Field(
        default=86400.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False, alias="MAX_RUN_S"
    )
    abort_timeout_s: float = Field(
        default=300.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False, alias="ABORT_TIMEOUT_S"
    )
    release_after: Literal["finished", "reported"] = Field(
        default="finished", alias="RELEASE_AFTER"
    )
    report_timeout_s: float = Field(
        default=3600.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False, alias="REPORT_TIMEOUT_S"
    )
    report_timeout_outcome: Literal["completed", "failed"] = Field(
        default="failed", alias="REPORT_TIMEOUT_OUTCOME"
    )
    rejected_retention_s: float = Field(
        default=7 * 86400.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False, alias="REJECTED_RETENTION_S"
    )
    server_lost_grace_s: float = Field(
        default=120.0, ge=0, le=MAX_SECONDS, allow_inf_nan=False, alias="SERVER_LOST_GRACE_S"
    )
    server_lost_rounds: int = Field(default=3, ge=1, alias="SERVER_LOST_ROUNDS")
    stuck_after_s: float = Field(
        default=300.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False, alias="STUCK_AFTER_S"
    )
    ready_poll_s: float = Field(
        default=1.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False, alias="READY_POLL_S"
    )
    admin_login_timeout_s: float = Field(
        default=10.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False, alias="ADMIN_LOGIN_TIMEOUT_S"
    )
    admin_command_timeout_s: float = Field(
        default=10.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False, alias="ADMIN_COMMAND_TIMEOUT_S"
    )
    admin_login_max_tries: int = Field(default=1, ge=1, alias="ADMIN_LOGIN_MAX_TRIES")

    retry_max: int = Field(default=6, ge=0, alias="RETRY_MAX")
    # At most an hour, as CALLBACK_MAX_BACKOFF_S: a retry, or the copy of a message whose
    # worker was lost, waits as a Celery countdown inside the visibility timeout.
    retry_backoff_max_s: int = Field(default=60, ge=1, le=3600, alias="RETRY_BACKOFF_MAX_S")
    housekeeping_interval_s: float = Field(
        default=15.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False, alias="HOUSEKEEPING_INTERVAL_S"
    )
    keep_alive_interval_s: float = Field(
        default=300.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False, alias="KEEP_ALIVE_INTERVAL_S"
    )
    # The beat lock's lease on PostgreSQL (app.beat): a holder that stops renewing it for this
    # long (host gone silent, process stopped) loses its session and the lock; renewed every
    # second, so at least 2; at most an hour (its TCP keepalive, a quarter of it, must stay
    # within what Linux takes, 32767 s, or libpq refuses every connection and the beat never
    # takes its lock).
    beat_lock_timeout_s: float = Field(
        default=10.0, ge=2, le=3600, allow_inf_nan=False, alias="BEAT_LOCK_TIMEOUT_S"
    )
    # While a QUEUED job waits for a busy net, that net's runs are polled this often (beat's
    # monitor-awaited-runs), so the job starts soon after the run before it ends; 0: only
    # every HOUSEKEEPING_INTERVAL_S.
    awaited_poll_s: float = Field(
        default=1.0, ge=0, le=MAX_SECONDS, allow_inf_nan=False, alias="AWAITED_POLL_S"
    )
    # AWAITED_POLL_S's name until 0.3.0, read (with a warning) where AWAITED_POLL_S is not
    # set, until 0.4.0 (app/deploy/CHANGELOG.md): it polls the runs a QUEUED job awaits.
    queued_poll_s_old: float | None = Field(
        default=None, ge=0, le=MAX_SECONDS, allow_inf_nan=False, alias="QUEUED_POLL_S"
    )
    housekeeping_parallel: int = Field(default=16, ge=1, alias="HOUSEKEEPING_PARALLEL")
    # The longest a prewarm holds a net's server up (app.usecases.prewarm): a hint asking
    # for longer is held this long, then the net's idle grace applies as after any job.
    prewarm_max_s: float = Field(
        default=900.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False, alias="PREWARM_MAX_S"
    )
    # Fair share between projects (app/usecases/fair_share.py): each project's weight and
    # optional cap of nets, as JSON; read into `shares` by the validator below.
    project_shares_raw: Annotated[str, NoDecode] = Field(default="{}", alias="PROJECT_SHARES")
    # A job QUEUED this long is taken before every job that is not (no job starves); at most
    # MAX_AGING_S, which the claim can still subtract from now.
    aging_s: float = Field(
        default=DEFAULT_AGING_S, gt=0, le=MAX_AGING_S, allow_inf_nan=False, alias="AGING_S"
    )
    _shares: Shares = PrivateAttr(default_factory=Shares)

    # --- S3 job bundles (app/adapters/s3_bundles.py) ---------------------------------
    # Credentials are never settings: boto3's default chain (task role, env, profile).
    s3_endpoint_url: str | None = Field(default=None, alias="S3_ENDPOINT_URL")  # tests: moto
    # Key prefixes, relative to the job folder, never downloaded (comma-separated).
    s3_excluded_prefixes: Annotated[tuple[str, ...], NoDecode] = Field(
        default=("server_checkpoints/",), alias="S3_EXCLUDED_PREFIXES"
    )
    s3_max_bundle_bytes: int = Field(default=2 * 1024**3, gt=0, alias="S3_MAX_BUNDLE_BYTES")
    s3_max_bundle_files: int = Field(default=10_000, gt=0, alias="S3_MAX_BUNDLE_FILES")

    @field_validator("s3_endpoint_url", mode="before")
    @classmethod
    def _s3_endpoint_url(cls, value: object) -> object:
        # Exported but empty means "AWS itself", like every other empty value.
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("s3_excluded_prefixes", mode="before")
    @classmethod
    def _s3_excluded_prefixes(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    # --- end S3 job bundles ---------------------------------------------------------

    # Job status pushed to flip-api (app.usecases.callbacks); unset: off.
    callback_url: str | None = Field(default=None, alias="CALLBACK_URL")
    callback_secret: SecretStr = Field(default=SecretStr(""), alias="CALLBACK_SECRET")
    # The secret a rotation replaces: while set, every try is signed with it as well, so a
    # receiver still on it verifies (tasks/README.md "Status callbacks").
    callback_previous_secret: SecretStr = Field(
        default=SecretStr(""), alias="CALLBACK_PREVIOUS_SECRET"
    )
    callback_timeout_s: float = Field(default=10.0, gt=0, le=60, alias="CALLBACK_TIMEOUT_S")
    # At most an hour: a retry waits as a Celery countdown, which must stay well inside the
    # broker's visibility timeout (app.celery_app.VISIBILITY_TIMEOUT_S).
    callback_max_backoff_s: float = Field(
        default=300.0, ge=1, le=3600, alias="CALLBACK_MAX_BACKOFF_S"
    )
    callback_max_4xx_tries: int = Field(default=3, ge=1, alias="CALLBACK_MAX_4XX_TRIES")
    # How many job events one read of a delivery round holds, the oldest first (a full read
    # is followed by another while the round has time); bounds a round's memory.
    callback_events_per_read: int = Field(
        default=200, ge=1, le=10_000, alias="CALLBACK_EVENTS_PER_READ"
    )

    api_secret: SecretStr = Field(default=SecretStr(""), alias="API_SECRET")
    # Bounds what one request may make the status API receive; an enqueue is a few KiB.
    api_max_body_bytes: int = Field(default=1024 * 1024, ge=1024, alias="API_MAX_BODY_BYTES")
    flower_basic_auth: SecretStr = Field(default=SecretStr(""), alias="FLOWER_BASIC_AUTH")
    # The virtualenv holding flwr (Flower, the federated-learning framework; not Celery
    # Flower) from which the local driver starts a Flower net's SuperLink: flwr cannot share
    # this service's virtualenv (tests/README.md "Dependencies").
    flwr_venv: Path | None = Field(default=None, alias="FLWR_VENV")
    log_json: Annotated[bool, NoDecode] = Field(default=False, alias="LOG_JSON")
    log_level: str = Field(default="INFO", alias="LOG_LEVEL")
    # OpenTelemetry spans of every job (app/traces.py; the `traces` extra), exported over
    # OTLP as the standard OTEL_* variables say; off: nothing of OpenTelemetry is imported.
    traces: Annotated[bool, NoDecode] = Field(default=False, alias="TRACES")
    # Spans written as JSON lines to this file instead of OTLP (tests, debugging).
    traces_file: Path | None = Field(default=None, alias="TRACES_FILE")

    @field_validator("per_job_fl_server", mode="before")
    @classmethod
    def _per_job(cls, value: object) -> bool:
        return parse_flag("PER_JOB_FL_SERVER", value, default=False)

    @field_validator("nets_file", "flwr_venv", "traces_file", mode="before")
    @classmethod
    def _nets_file(cls, value: object) -> object:
        # An exported-but-empty NETS_FILE means "not set", like every other empty value.
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("callback_url", mode="before")
    @classmethod
    def _callback_url(cls, value: object) -> object:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if not isinstance(value, str) or not re.match(
            r"^https?://[^/\s]+", value.strip(), re.IGNORECASE
        ):
            # The value may carry credentials: name the rule, not the value.
            raise SettingsError("CALLBACK_URL must be an http:// or https:// URL")
        url = value.strip()
        # A port that is no number, or a broken IPv6 host, failed every delivery round with
        # the client's invalid-URL error (an exception, not a back-off); a port out of range
        # or no host at all, unreachable for ever: each refused at start instead.
        try:
            parts = urlsplit(url)
            usable = bool(parts.hostname)
            parts.port  # noqa: B018 (raises ValueError: not a number, or out of range)
        except ValueError:
            usable = False
        if not usable:
            raise SettingsError("CALLBACK_URL must name a host and, if any, a port number")
        if parts.netloc.count("@") > 1:
            # The client reads the password up to the last '@', redact_url and the log
            # filter up to the first: the rest of the password was left readable.
            raise SettingsError("CALLBACK_URL: write an '@' in its user or password as %40")
        if not _client_can_send_to(url):
            raise SettingsError("CALLBACK_URL must be a URL the HTTP client can send to")
        return url

    @field_validator("log_json", mode="before")
    @classmethod
    def _log_json(cls, value: object) -> bool:
        return parse_flag("LOG_JSON", value, default=False)

    @field_validator("traces", mode="before")
    @classmethod
    def _traces(cls, value: object) -> bool:
        return parse_flag("TRACES", value, default=False)

    @model_validator(mode="after")
    def _derive(self) -> Settings:
        # Derived defaults live in the data folder so a laptop needs no server at all.
        # Resolved once, here: a process that changes directory later (a worker, a test)
        # keeps the one folder it started with.
        data = self.data_dir.resolve()
        object.__setattr__(self, "data_dir", data)
        if self.queued_poll_s_old is not None:
            if "awaited_poll_s" not in self.model_fields_set:
                object.__setattr__(self, "awaited_poll_s", self.queued_poll_s_old)
            logging.getLogger(__name__).warning(
                "QUEUED_POLL_S is deprecated: set AWAITED_POLL_S (read instead until 0.4.0;"
                " ignored where AWAITED_POLL_S is set)"
            )
        if not self.database_url:
            object.__setattr__(self, "database_url", f"sqlite:///{data / 'fl-dispatcher.db'}")
        object.__setattr__(self, "database_url", normalise_database_url(self.database_url))
        if not self.broker_url:
            object.__setattr__(self, "broker_url", f"sqla+sqlite:///{data / 'broker.db'}")
        if self.nets_file is not None and self.nets_inline.strip():
            raise SettingsError("set NETS_FILE or NETS, not both")
        if self.nets_file is not None:
            nets = parse_nets(load_nets_file(self.nets_file), f"NETS_FILE={self.nets_file}")
            self._nets = nets
        elif self.nets_inline.strip():
            try:
                raw = json.loads(self.nets_inline)
            except json.JSONDecodeError as exc:
                raise SettingsError(f"NETS: not valid JSON: {exc}") from None
            except RecursionError:  # valid JSON past the interpreter's recursion limit
                raise SettingsError("NETS: JSON nested too deeply to read") from None
            self._nets = parse_nets(raw, "NETS")
        for net in self._nets:
            per_job = (
                self.per_job_fl_server if net.per_job_fl_server is None else net.per_job_fl_server
            )
            net._always_on = net.driver.kind == "static" or not per_job
        self._by_name = {net.name: net for net in self._nets}
        self._shares = parse_project_shares(self.project_shares_raw, self.aging_s)
        if self.callback_url is not None and len(self.callback_secret.get_secret_value()) < 16:
            # Unsigned (or guessably signed) status pushes would let anyone on the path
            # forge a job's end; refuse to start instead.
            raise SettingsError(
                "CALLBACK_SECRET must be set (at least 16 characters) when CALLBACK_URL is set"
            )
        _check_webhook_secret(self.callback_secret.get_secret_value())
        check_api_secret(self.api_secret.get_secret_value())
        refuse_placeholders(
            CALLBACK_SECRET=self.callback_secret.get_secret_value(),
            CALLBACK_PREVIOUS_SECRET=self.callback_previous_secret.get_secret_value(),
            API_SECRET=self.api_secret.get_secret_value(),
            DATABASE_URL=url_password(self.database_url),
            BROKER_URL=url_password(self.broker_url),
        )
        previous = self.callback_previous_secret.get_secret_value()
        if previous and len(previous) < 16:
            raise SettingsError("CALLBACK_PREVIOUS_SECRET must be at least 16 characters")
        _check_webhook_secret(previous, "CALLBACK_PREVIOUS_SECRET")
        return self

    @property
    def callback_signing_secrets(self) -> tuple[str, ...]:
        """Every secret a callback is signed with: CALLBACK_SECRET, then the previous one
        while a rotation lasts."""
        current = self.callback_secret.get_secret_value()
        previous = self.callback_previous_secret.get_secret_value()
        return (current, previous) if previous and previous != current else (current,)

    @property
    def data_dir_defaulted(self) -> bool:
        """FL_DISPATCHER_DATA_DIR was not set: the data folder is `.fl-dispatcher` under the
        directory the process started in (the CLI says so)."""
        return "data_dir" not in self.model_fields_set

    def report_timeout_for(self, net_name: str | None) -> float:
        """How long a FINISHING job on this net waits for flip-api's report (the net's
        `report_timeout_s`, else REPORT_TIMEOUT_S; an undeclared net has the global one)."""
        by_name: dict[str, NetConfig] = self._private["_by_name"]
        net = by_name.get(net_name) if net_name is not None else None
        if net is not None and net.report_timeout_s is not None:
            return net.report_timeout_s
        return self.report_timeout_s

    @property
    def callbacks_enabled(self) -> bool:
        """True when job status changes are pushed to CALLBACK_URL."""
        return self.callback_url is not None

    @property
    def nets(self) -> tuple[NetConfig, ...]:
        """Every declared net, validated in full."""
        return self._private["_nets"]  # type: ignore[no-any-return]

    @property
    def shares(self) -> Shares:
        """PROJECT_SHARES and AGING_S, as the claim orders by them."""
        return self._private["_shares"]  # type: ignore[no-any-return]

    def net(self, name: str) -> NetConfig:
        """The configuration of one net; KeyError if it is not declared."""
        return self._private["_by_name"][name]  # type: ignore[no-any-return]

    def has_net(self, name: str | None) -> bool:
        """True when `name` is a declared net."""
        return name is not None and name in self._private["_by_name"]

    @property
    def _private(self) -> dict[str, Any]:
        # The hottest reads of a round (once per net per loop): pydantic's attribute lookup
        # of a private attribute costs about 4 us, its dict read 0.1 us (issue 37).
        return self.__pydantic_private__  # type: ignore[return-value]

    def redacted(self) -> dict[str, Any]:
        """The effective configuration with secrets and URL passwords masked."""
        data = self.model_dump(mode="json", by_alias=True)
        data.pop("NETS", None)
        for key in ("DATABASE_URL", "BROKER_URL"):
            data[key] = redact_url(str(data[key]))
        if data["CALLBACK_URL"] is not None:
            data["CALLBACK_URL"] = redact_url(str(data["CALLBACK_URL"]))
        data["nets"] = [n.model_dump(mode="json") for n in self.nets]
        for net in data["nets"]:
            net["always_on"] = self.net(net["name"]).always_on
        return data


# The PostgreSQL driver this project installs; Heroku-style and plain URLs name it implicitly.
_PG_SCHEMES = ("postgres", "postgresql")
_PG_DRIVER = "postgresql+psycopg"


def normalise_database_url(url: str) -> str:
    """`postgres://` and `postgresql://` mean PostgreSQL through psycopg 3 (SQLAlchemy would
    refuse the first and look for psycopg2 for the second); another PostgreSQL driver is
    refused with the fix, since it is not installed."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    if scheme in _PG_SCHEMES:
        return f"{_PG_DRIVER}://{rest}"
    if scheme.startswith("postgresql+") and scheme != _PG_DRIVER:
        raise SettingsError(
            f"DATABASE_URL: driver {scheme.split('+', 1)[1]!r} is not installed; "
            f"use {_PG_DRIVER}://... (psycopg 3), or postgresql://... which means the same"
        )
    return url


def _client_can_send_to(url: str) -> bool:
    """The URL as the callback sender's client reads it, up to the name lookup: a host it
    cannot parse or encode (a bad IPv6 or IPv4 literal, a control character, an IDNA label
    it refuses, an empty label or one over 63 characters) raised at every delivery round
    instead of backing off. (httpx is loaded only where a CALLBACK_URL is set.)"""
    import httpx

    try:
        request = httpx.Request("POST", url)
        request.url.raw_host.decode("ascii").encode("idna")  # what the resolver is given
    except (httpx.InvalidURL, UnicodeError):
        return False
    return True


# Names a settings file every process reads (load_settings); `--env-file` sets it, so that a
# worker's pool processes, which build their settings again, read the same file.
ENV_FILE_VARIABLE = "FL_DISPATCHER_ENV_FILE"


def use_env_file(path: Path) -> None:
    """Make `path` the settings file of this process and of every process it starts."""
    os.environ[ENV_FILE_VARIABLE] = str(path.resolve())


def load_settings(env_file: Path | None = None, **overrides: Any) -> Settings:
    """Build Settings from the environment, turning validation errors into one clear message.

    `env_file` (default: the file FL_DISPATCHER_ENV_FILE names, if any): `NAME=value` lines
    (`#` comments, quotes as in a shell) read under the environment, which wins, as compose
    reads its `env_file`: the settings of a folder the demo kept or `local-net` made, say.
    Names that are no setting are ignored.
    """
    if env_file is None and os.environ.get(ENV_FILE_VARIABLE, "").strip():
        env_file = Path(os.environ[ENV_FILE_VARIABLE].strip())
    if env_file is not None and not env_file.is_file():
        raise SettingsError(f"settings file {env_file}: no such file")
    try:
        return Settings(_env_file=env_file, **overrides)
    except SettingsError:
        raise
    except ValidationError as exc:
        # pydantic wraps errors raised in validators; surface ours unwrapped.
        for err in exc.errors():
            ctx_error = (err.get("ctx") or {}).get("error")
            if isinstance(ctx_error, SettingsError):
                raise ctx_error from None
        raise SettingsError(format_validation_error("settings", exc)) from None


# pragma: no mutate end


def _check_webhook_secret(secret: str, name: str = "CALLBACK_SECRET") -> None:
    """A `whsec_` secret (`name`) is a Standard Webhooks secret: base64 after the prefix
    (app.adapters.callbacks.webhook_key decodes it). The message never quotes the secret."""
    if not secret.startswith("whsec_"):
        return
    try:
        short = len(base64.b64decode(secret[len("whsec_") :], validate=True)) < 16
    except ValueError:  # binascii.Error, or a plain ValueError for non-ASCII text
        short = True  # not base64: no key at all
    if short:
        raise SettingsError(
            f"{name}: a whsec_ secret must be base64 of at least 16 bytes after "
            "whsec_ (e.g. whsec_ + `openssl rand -base64 32`)"
        )
