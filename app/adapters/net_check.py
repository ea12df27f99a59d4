"""A net's files checked before its server is dialled, whatever its backend: an NVFLARE
admin kit (`nvflare.kit_check`) or a Flower net's CA, SuperLink certificate and flwr
(`flower.files_check`). `config check` and a worker's start call these."""

from __future__ import annotations

from app.errors import AdminMisconfigured
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
