"""How the nets are shared between projects (issue 40): PROJECT_SHARES read and validated, and
the `Shares` the claim orders by (app.usecases.fair_share). Imports pydantic and the payload
rules only, like app.net_config."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.errors import SettingsError
from app.net_config import format_validation_error
from app.schemas import PROJECT_ID_MAX_CHARS, project_id_from

# AGING_S's default: a job QUEUED for six hours is taken before every job that is not.
DEFAULT_AGING_S = 6 * 3600.0
# AGING_S's largest value (about 31 years: aging off in effect): the claim subtracts it from
# now, which a much larger one takes before year 1 (OverflowError in every claim).
MAX_AGING_S = 1e9
# The smallest weight: a share a million times below a project of weight 1.
MIN_WEIGHT = 1e-6


class ProjectShare(BaseModel):
    """One project's entry in PROJECT_SHARES."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # At least MIN_WEIGHT: the claim divides the nets a project holds by it, and PostgreSQL's
    # float8 raises on overflow (a weight of 1e-320 failed every claim once its project held
    # a net; tests/integration/test_fair_share_pg.py).
    weight: float = Field(default=1.0, ge=MIN_WEIGHT, allow_inf_nan=False, strict=True)
    max_nets: int | None = Field(default=None, ge=1, strict=True)


@dataclass(frozen=True)
class Shares:
    """The claim's view of PROJECT_SHARES and AGING_S: hashable, so the claim's statements,
    built once per process, are keyed by it (a project without an entry, and the default
    project of jobs that name none, weigh 1 and have no cap)."""

    weights: tuple[tuple[str, float], ...] = ()  # the projects whose weight is not 1
    caps: tuple[tuple[str, int], ...] = ()  # the projects with a max_nets
    aging_s: float = DEFAULT_AGING_S

    @property
    def aging(self) -> timedelta:
        """AGING_S: a job QUEUED this long since its enqueue is aged."""
        return timedelta(seconds=self.aging_s)

    def weight(self, project: str | None) -> float:
        """The project's weight (1 unless PROJECT_SHARES says otherwise)."""
        return dict(self.weights).get(project or "", 1.0)

    def cap(self, project: str | None) -> int | None:
        """The project's max_nets, or None: no cap."""
        return dict(self.caps).get(project or "")


def parse_project_shares(raw: str, aging_s: float = DEFAULT_AGING_S) -> Shares:
    """PROJECT_SHARES as `Shares`: a JSON object of project id -> {"weight": a number of at
    least MIN_WEIGHT (default 1), "max_nets": a whole number of at least 1 (default: no
    cap)}. SettingsError naming the project and the field otherwise."""
    text = raw.strip()
    if not text:
        return Shares(aging_s=aging_s)
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"PROJECT_SHARES: not valid JSON: {exc}") from None
    except RecursionError:  # valid JSON nested past the interpreter's recursion limit
        raise SettingsError("PROJECT_SHARES: JSON nested too deeply to read") from None
    if not isinstance(data, dict):
        raise SettingsError(
            'PROJECT_SHARES must be a JSON object: {"<project id>": {"weight": 2, "max_nets": 1}}'
        )
    weights: list[tuple[str, float]] = []
    caps: list[tuple[str, int]] = []
    for project, entry in sorted(data.items()):
        if project_id_from(project) is None:
            raise SettingsError(
                f"PROJECT_SHARES: {project!r} is not a project id (1 to "
                f"{PROJECT_ID_MAX_CHARS} of A-Za-z0-9._:@-, not starting with '.')"
            )
        try:
            share = ProjectShare.model_validate(entry)
        except ValidationError as exc:
            raise SettingsError(
                format_validation_error(f"PROJECT_SHARES: project {project!r}", exc)
            ) from None
        if share.weight != 1.0:
            weights.append((project, share.weight))
        if share.max_nets is not None:
            caps.append((project, share.max_nets))
    return Shares(tuple(weights), tuple(caps), aging_s)
