"""A net's files checked before its server is dialled, whatever its backend: an NVFLARE
admin kit (`nvflare.kit_check`) or a Flower net's CA, SuperLink certificate and flwr
(`flower.files_check`). `config check` and a worker's start call these."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NoReturn

from app.errors import AdminMisconfigured, FilesNameAnotherServer
from app.net_config import NetConfig
from app.settings import Settings


def files_problem(net: NetConfig, settings: Settings) -> AdminMisconfigured | None:
    """Why the net's files are missing, unreadable or unusable (as this user), or None."""
    try:
        if net.backend == "flower":
            from app.adapters.flower.files_check import check_flower_files

            check_flower_files(net, settings)
        elif net.admin is not None:
            from app.adapters.nvflare.kit_check import check_kit_files

            check_kit_files(net.admin.kit_dir)
    except AdminMisconfigured as exc:
        return exc
    return None


def endpoint_problem(
    net: NetConfig, settings: Settings, *, unread_is_a_problem: bool = True
) -> str | None:
    """Why the net's files are for another server than the one it runs, or None (see each
    backend's check; an unreadable kit counts unless `unread_is_a_problem` is False)."""
    if net.backend == "flower":
        from app.adapters.flower.files_check import flower_endpoint_problem

        return flower_endpoint_problem(net, settings)
    from app.adapters.nvflare.kit_check import kit_endpoint_problem

    return kit_endpoint_problem(net, unread_is_a_problem=unread_is_a_problem)


# The nets whose files this process's last worker start found naming another server (name
# -> why): what those files reach is not the net's server, so nothing is sent there from this
# process (`RefusingAdmin`) until a start finds them right. Per process, as the files are.
_FOUND_WRONG: dict[str, str] = {}


def record_start_check(problems: Mapping[str, str]) -> None:
    """What this process's worker start found (`endpoint_problem` of every net), replacing
    what an earlier start of it found."""
    _FOUND_WRONG.clear()
    _FOUND_WRONG.update(problems)


def found_wrong(net_name: str) -> str | None:
    """Why this process's start found the net's files naming another server, or None."""
    return _FOUND_WRONG.get(net_name)


class RefusingAdmin:
    """The admin client of a net whose files this process's start found naming another
    server (`found_wrong`): every call refused as misconfigured (`FilesNameAnotherServer`,
    which each caller already classifies), nothing sent. A run such a call watches, aborts
    or submits is on the net's own server, which these files do not reach."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def close(self) -> None:
        """Nothing is open."""

    def __getattr__(self, name: str) -> Callable[..., NoReturn]:
        def refused(*_args: object, **_kwargs: object) -> NoReturn:
            raise FilesNameAnotherServer(f"this worker's files: {self.reason}")

        return refused
