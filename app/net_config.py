"""What a net is declared as (its backend, driver, admin kit or SuperLink, and timeouts), and
reading the nets file or the inline list that declares them all, validated in full: an error
names the net and the field."""

from __future__ import annotations

import json
import posixpath
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from app.errors import AdminMisconfigured, SettingsError
from app.flags import parse_flag
from app.schemas import NET_NAME_PATTERN, unstorable


def _is(path: Path, kind: Callable[[Path], bool]) -> bool:
    """`kind(path)`, True when this user may not look (a kit folder chmod 700 by the user
    who provisioned it): every process would stop on a PermissionError otherwise, while
    `config check` warns about that kit as this user's, and the net is MISCONFIGURED at its
    first preflight."""
    try:
        return kind(path)
    except PermissionError:
        return True


def _listenable(value: str) -> str:
    """`host:port` with a port a server can listen on."""
    if not 1 <= int(value.rpartition(":")[2]) <= 65535:
        raise ValueError(f"{value}: a server listens on a port from 1 to 65535")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EcsDriverConfig(_Strict):
    """An fl-server run as an ECS service; credentials come from boto3's standard chain."""

    kind: Literal["ecs"]
    region: str = Field(min_length=1)
    cluster: str = Field(min_length=1)
    service: str = Field(min_length=1)
    endpoint_url: str | None = None  # only for tests against moto's server

    @field_validator("cluster", "service")
    @classmethod
    def _name(cls, value: str, info: ValidationInfo) -> str:
        """The cluster and the service by name, each given by name or by ARN (Terraform's
        `aws_ecs_service.id` is the ARN): ECS answers DescribeServices by `serviceName`, and
        the IAM policy builds its ARN from the names. An ARN must be the net's own: of ECS,
        in the net's region, a service's in the net's cluster."""
        kind = str(info.field_name)
        region = info.data.get("region", "")
        name = _ecs_arn_name(value, kind, region)
        if "/" in name:  # a long service ARN's service/<cluster>/<name>
            in_cluster, name = name.split("/", 1)
            cluster = info.data.get("cluster")
            if in_cluster != cluster:
                raise ValueError(f"service {value!r} is in cluster {in_cluster!r}, not {cluster!r}")
        return name


class LocalDriverConfig(_Strict):
    """An fl-server started as a local process from its provisioned startup kit."""

    kind: Literal["local"]
    server_kit_dir: Path  # the participant folder holding startup/ (e.g. .../prod_00/server)

    @field_validator("server_kit_dir")
    @classmethod
    def _kit_has_startup(cls, value: Path) -> Path:
        if not _is(value / "startup", Path.is_dir):
            raise ValueError(f"{value} has no startup/ folder (not an NVFLARE server kit)")
        return value


class FlowerLocalDriverConfig(_Strict):
    """A Flower net's SuperLink started as a local process from FLWR_VENV's flwr, with TLS
    and SuperNode authentication on (flwr allows the second only with the first: it is what
    names SuperNodes for readiness) and its state in a database that outlives the process
    (the SuperNodes registered by name, and the runs)."""

    kind: Literal["local"]
    superlink_dir: Path  # its working folder: state.db and FLWR_HOME (made if missing)
    ssl_certfile: Path  # the SuperLink's certificate (PEM), signed by flower.root_certificates
    ssl_keyfile: Path  # its private key (PEM): read by the SuperLink alone

    @field_validator("ssl_certfile", "ssl_keyfile")
    @classmethod
    def _a_file(cls, value: Path) -> Path:
        if not _is(value, Path.is_file):
            raise ValueError(f"{value} is no file")
        return value


class StaticDriverConfig(_Strict):
    """An always-on server that is never scaled."""

    kind: Literal["static"]


# Docker's own rule for container names.
# Every duration setting's largest value (about 31 years: "for ever" in effect). The use
# cases add them to now and subtract them from it, which a larger one (or inf) takes past
# year 9999 or before year 1: an OverflowError in every round that reads it (a monitor
# round of every net, a refused enqueue dropped unrecorded).
MAX_SECONDS = 1e9
DOCKER_CONTAINER_NAME_PATTERN = r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$"


class DockerDriverConfig(_Strict):
    """An fl-server run as an existing container, started and stopped through the Docker
    Engine API (Docker, or podman's Docker-compatible service). The container is created
    by the operator (compose), never by the driver: see app/adapters/drivers/docker.py."""

    kind: Literal["docker"]
    container: str = Field(pattern=DOCKER_CONTAINER_NAME_PATTERN)
    # The Engine API endpoint: the engine's socket, or (least privilege) a socket proxy
    # that allows only start, stop and inspect of the fl-server containers. Never read
    # from DOCKER_HOST: one home for configuration.
    engine_url: str = Field(
        default="unix:///var/run/docker.sock", pattern=r"^(unix|tcp|http|https)://.+$"
    )
    # How long the server gets to stop on SIGTERM before the engine sends SIGKILL.
    stop_timeout_s: int = Field(default=30, ge=0, le=600)
    # Bound on one Engine API call (a stop waits stop_timeout_s on top).
    api_timeout_s: int = Field(default=10, gt=0, le=120)


def _driver_tag(value: Any) -> str | None:
    """Which driver config a declaration is: its kind, and for `local` the backend's form
    (a Flower SuperLink's `superlink_dir`, or an NVFLARE kit's `server_kit_dir`)."""
    if isinstance(value, Mapping):
        kind = value.get("kind")
        return "local-flower" if kind == "local" and "superlink_dir" in value else kind
    if isinstance(value, FlowerLocalDriverConfig):
        return "local-flower"
    return getattr(value, "kind", None)


DriverConfig = Annotated[
    Annotated[EcsDriverConfig, Tag("ecs")]
    | Annotated[LocalDriverConfig, Tag("local")]
    | Annotated[FlowerLocalDriverConfig, Tag("local-flower")]
    | Annotated[StaticDriverConfig, Tag("static")]
    | Annotated[DockerDriverConfig, Tag("docker")],
    Discriminator(_driver_tag),
]

HOST_PORT_PATTERN = r"^[A-Za-z0-9.\-]+:[0-9]{1,5}$"


class AdminConfig(_Strict):
    """The admin startup kit used to talk to the net's server."""

    kit_dir: Path  # the admin participant folder holding startup/fed_admin.json
    username: str = Field(min_length=1)

    @field_validator("kit_dir")
    @classmethod
    def _kit_readable(cls, value: Path) -> Path:
        if not _is(value / "startup" / "fed_admin.json", Path.is_file):
            raise ValueError(f"{value} has no startup/fed_admin.json (not an NVFLARE admin kit)")
        return value


class FlowerConfig(_Strict):
    """How the dispatcher reaches a Flower net's SuperLink: its Control API (flwr 1.42 serves
    it on the SuperLink's one port, with the Fleet API the SuperNodes dial)."""

    address: str = Field(pattern=HOST_PORT_PATTERN)
    # The CA (PEM) that signed the SuperLink's certificate; unset: the system's CAs.
    root_certificates: Path | None = None
    # Plain HTTP, no TLS: a SuperLink on loopback in a test only.
    insecure: bool = False

    @field_validator("root_certificates")
    @classmethod
    def _ca_file(cls, value: Path | None) -> Path | None:
        if value is not None and not _is(value, Path.is_file):
            raise ValueError(f"{value} is no file (the CA of the SuperLink's certificate)")
        return value

    @field_validator("address")
    @classmethod
    def _a_port(cls, value: str) -> str:
        return _listenable(value)

    @model_validator(mode="after")
    def _tls_or_not(self) -> FlowerConfig:
        if self.insecure and self.root_certificates is not None:
            raise ValueError("insecure (no TLS) and a CA file for TLS: choose one")
        return self


class NetConfig(_Strict):
    """One net: its backend, its driver, how to reach its server, and its timeouts."""

    name: str = Field(pattern=NET_NAME_PATTERN)
    # The federated-learning server the net runs: NVIDIA FLARE (an admin kit) or a Flower
    # SuperLink (its Control API); see app/adapters/backend.py.
    backend: Literal["nvflare", "flower"] = "nvflare"
    driver: DriverConfig
    admin: AdminConfig | None = None  # nvflare: required
    flower: FlowerConfig | None = None  # flower: required
    idle_timeout_s: float = Field(default=600.0, ge=0, le=MAX_SECONDS, allow_inf_nan=False)
    ready_timeout_s: float = Field(default=900.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    required_sites: tuple[str, ...] = ()
    # The sites provisioned for this net (None: not declared). Declared, a job that needs a
    # site the net does not have is refused at enqueue instead of waiting out the readiness
    # deadline for a site that can never connect.
    sites: tuple[str, ...] | None = None
    max_run_s: float | None = Field(
        default=None, gt=0, le=MAX_SECONDS, allow_inf_nan=False
    )  # None: MAX_RUN_S
    report_timeout_s: float | None = Field(
        default=None, gt=0, le=MAX_SECONDS, allow_inf_nan=False
    )  # None: REPORT_TIMEOUT_S
    # None: follow the global PER_JOB_FL_SERVER; a static driver is always-on regardless.
    per_job_fl_server: bool | None = None
    # "host:port" the net's server serves on, as its admin kit must name it. The local driver
    # reads it from the server kit; declare it for ecs and static nets to have a kit that
    # points elsewhere reported as a misconfiguration instead of "server never came up".
    server_endpoint: str | None = Field(default=None, pattern=HOST_PORT_PATTERN)
    # None: RELEASE_AFTER. "reported": hold the server after NVFLARE finished until flip-api
    # reports the results uploaded (FLIP's fl-server uploads them from its own disk).
    release_after: Literal["finished", "reported"] | None = None
    # Resolved once when Settings are built (the net's flag, else the global one).
    _always_on: bool = PrivateAttr(default=True)

    @property
    def admin_kit(self) -> AdminConfig:
        """The NVFLARE admin kit; AdminMisconfigured for a net of another backend."""
        if self.admin is None:  # only a Flower net: NetConfig refuses an NVFLARE one without
            raise AdminMisconfigured(f"net {self.name!r} has no NVFLARE admin kit")
        return self.admin

    @property
    def always_on(self) -> bool:
        """True when the net's server must never be scaled (static driver, or flag off)."""
        # Read from pydantic's private dict: its attribute lookup costs 2-4 us, this 0.2 us,
        # and reconcile asks it of every net every round (issue 37).
        return self.__pydantic_private__["_always_on"]  # type: ignore[index,no-any-return]

    def holds_for_report(self, default: str) -> bool:
        """True when a finished run keeps the server until flip-api reports the upload."""
        return (self.release_after or default) == "reported"

    @property
    def tokens_by_lookup(self) -> bool:
        """True when the net's server keeps no submit token of its own (a Flower SuperLink):
        the client finds a token's run by listing the runs, and stops a later run of the
        token only in such a lookup (`app.adapters.flower.client`). NVFLARE resolves it."""
        return self.backend == "flower"

    @property
    def pending_runs_revive(self) -> bool:
        """True when the net's server, started again, runs what was pending when it died (a
        Flower SuperLink with its state database): such a run is not gone with its server
        (`app.usecases.revived_runs`). NVFLARE never resumes a run a restart killed."""
        return self.backend == "flower"

    @property
    def scales_to_zero(self) -> bool:
        """True when the net's server runs only while a job needs it."""
        return not self.always_on

    @model_validator(mode="after")
    def _backend_settings(self) -> NetConfig:
        if self.backend == "nvflare":
            if self.admin is None:
                raise ValueError("'admin' is missing: an NVFLARE net's kit (kit_dir, username)")
            if self.flower is not None:
                raise ValueError('[flower] is for a Flower net (backend = "flower")')
            if isinstance(self.driver, FlowerLocalDriverConfig):
                raise ValueError(
                    'driver.superlink_dir is for a Flower net (backend = "flower"); an '
                    "NVFLARE net's local driver takes server_kit_dir"
                )
            return self
        if self.flower is None:
            raise ValueError("'flower' is missing: a Flower net's SuperLink address (and CA)")
        if self.admin is not None:
            raise ValueError("[admin] is an NVFLARE admin kit: a Flower net has [flower]")
        if self.server_endpoint is not None:
            raise ValueError("server_endpoint is NVFLARE's: a Flower net's is flower.address")
        if isinstance(self.driver, LocalDriverConfig):
            raise ValueError(
                "a Flower net's local driver takes superlink_dir, ssl_certfile and "
                "ssl_keyfile (server_kit_dir is an NVFLARE server kit)"
            )
        if isinstance(self.driver, FlowerLocalDriverConfig) and (
            self.flower.insecure or self.flower.root_certificates is None
        ):
            raise ValueError(
                "a local SuperLink runs with TLS (SuperNode authentication needs it): set "
                "flower.root_certificates to the CA that signed driver.ssl_certfile"
            )
        return self

    @model_validator(mode="after")
    def _defaults_among_sites(self) -> NetConfig:
        if self.sites is not None:
            unknown = [s for s in self.required_sites if s not in self.sites]
            if unknown:
                raise ValueError(f"required_sites {unknown} are not among its sites")
        return self

    def lacks(self, sites: Sequence[str]) -> list[str]:
        """The sites of `sites` this net does not have (none when its sites are undeclared)."""
        return [] if self.sites is None else [s for s in sites if s not in self.sites]

    @field_validator("sites", "required_sites")
    @classmethod
    def _storable_sites(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        """A site name PostgreSQL can hold: the claim asks it whether a job's sites are among
        the net's (app.usecases.site_fit, jsonb), and no job can need a name it refuses."""
        for site in value or ():
            problem = unstorable(site)
            if problem is not None:
                raise ValueError(f"site {site!r} {problem}: no job can name it")
        return value

    @field_validator("server_endpoint")
    @classmethod
    def _a_port_a_server_can_listen_on(cls, value: str | None) -> str | None:
        return None if value is None else _listenable(value)

    @field_validator("per_job_fl_server", mode="before")
    @classmethod
    def _flag(cls, value: object) -> bool | None:
        if value is None or (isinstance(value, str) and value.strip() == ""):
            return None
        return parse_flag("per_job_fl_server", value, default=False)


def format_validation_error(prefix: str, exc: ValidationError) -> str:
    """pydantic's errors as one line: each names its field after `prefix`."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(net)"
        parts.append(f"{prefix}: field '{loc}': {err['msg']}")
    return "; ".join(parts)


def parse_nets(raw: Any, source: str) -> tuple[NetConfig, ...]:
    """Validate a list of net declarations in full; every error names the net and the field."""
    if isinstance(raw, Mapping) and "nets" in raw:
        raw = raw["nets"]
    if not isinstance(raw, list):
        raise SettingsError(f"{source}: expected a list of nets, got {type(raw).__name__}")
    nets: list[NetConfig] = []
    for index, item in enumerate(raw):
        label = item.get("name") if isinstance(item, Mapping) else None
        prefix = f"{source}: net '{label}'" if label else f"{source}: net #{index}"
        try:
            nets.append(NetConfig.model_validate(item))
        except ValidationError as exc:
            raise SettingsError(format_validation_error(prefix, exc)) from None
    names = [n.name for n in nets]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SettingsError(f"{source}: net names must be unique, repeated: {duplicates}")
    _refuse_shared_servers(nets, source)
    return tuple(nets)


def _ecs_arn_name(value: str, kind: str, region: str) -> str:
    """An ECS `kind` (cluster or service) given by name or ARN, as its name (a long service
    ARN's `<cluster>/<name>`); ValueError for an ARN of another service, kind or region."""
    if not value.startswith("arn:"):
        if "/" in value:
            raise ValueError(f"{kind} {value!r}: a name has no '/' (or give the whole ARN)")
        return value
    parts = value.split(":", 5)
    resource = parts[5] if len(parts) == 6 else ""
    if parts[2:3] != ["ecs"] or not resource.startswith(f"{kind}/"):
        raise ValueError(f"{kind} {value!r} is not an ECS {kind} ARN")
    if parts[3] != region:
        raise ValueError(f"{kind} {value!r} is in region {parts[3]!r}, not the net's {region!r}")
    name = resource.removeprefix(f"{kind}/")
    if not name or name.startswith("/") or name.endswith("/") or name.count("/") > 1:
        raise ValueError(f"{kind} {value!r} is not an ECS {kind} ARN")
    if kind == "cluster" and "/" in name:
        raise ValueError(f"{kind} {value!r} is not an ECS {kind} ARN")
    return name


def _engine(url: str) -> str:
    """A Docker engine URL as the engine it reaches: the Docker SDK reads tcp:// as http://,
    a host name is case-insensitive, and unix://var/... and unix:///var/... name one socket."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme in ("unix", "http+unix", "npipe"):
        path = posixpath.normpath("/" + (parts.netloc + parts.path).lstrip("/"))
        return f"{scheme.removeprefix('http+')}:{path}"
    scheme = "http" if scheme == "tcp" else scheme
    try:
        port = parts.port
    except ValueError:  # not a number: compared as written (the driver refuses it anyway)
        return f"{scheme}://{parts.netloc.lower()}"
    return f"{scheme}://{(parts.hostname or '').lower()}:{port}"


def server_identities(net: NetConfig) -> list[tuple[str, tuple[object, ...]]]:
    """What names the server a net drives, as (field, identity) pairs: two nets sharing one
    would stop each other's server (one net's idle scale-down under the other's job)."""
    driver = net.driver
    found: list[tuple[str, tuple[object, ...]]] = []
    if isinstance(driver, DockerDriverConfig):
        found.append(("driver.container", (_engine(driver.engine_url), driver.container)))
    elif isinstance(driver, EcsDriverConfig):
        # (By name: an ARN given is read as its name, `EcsDriverConfig._name`.)
        key = (driver.endpoint_url, driver.region, driver.cluster)
        found.append(("driver.cluster+service", (*key, driver.service)))
    elif isinstance(driver, LocalDriverConfig):
        found.append(("driver.server_kit_dir", (str(driver.server_kit_dir.resolve()),)))
    elif isinstance(driver, FlowerLocalDriverConfig):
        found.append(("driver.superlink_dir", (str(driver.superlink_dir.resolve()),)))
    if net.flower is not None:
        found.append(("flower.address", (net.flower.address.lower(),)))
    if net.server_endpoint is not None:
        # Any kind, and the only identity a static net declares: the address is the server.
        found.append(("server_endpoint", (net.server_endpoint.lower(),)))
    return found


def _refuse_shared_servers(nets: Sequence[NetConfig], source: str) -> None:
    owners: dict[tuple[str, tuple[object, ...]], str] = {}
    for net in nets:
        for field, identity in server_identities(net):
            first = owners.setdefault((field, identity), net.name)
            if first != net.name:
                raise SettingsError(
                    f"{source}: nets '{first}' and '{net.name}' name the same server "
                    f"(field '{field}'): each net needs a server of its own"
                )


def load_nets_file(path: Path) -> Any:
    """Read a nets file, TOML (`[[nets]]`) or JSON by extension."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SettingsError(f"NETS_FILE={path}: cannot read: {exc.strerror}") from None
    try:
        if path.suffix == ".toml":
            return tomllib.loads(text)
        return json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise SettingsError(
            f"NETS_FILE={path}: not valid {path.suffix[1:] or 'JSON'}: {exc}"
        ) from None
    except RecursionError:  # valid, but nested past the interpreter's recursion limit
        raise SettingsError(f"NETS_FILE={path}: nested too deeply to read") from None
