"""An admin kit provisioned for another project (its own CA, its own server address) is a
misconfiguration, said at `config check` and at worker start, never a server that "does not
come up". Real kits from nvflare's provisioner; no server needs to run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.adapters.nvflare.kit_check import kit_endpoint_problem
from app.celery_app import prepare_nets_at_start
from app.db import make_engine, session_factory
from app.entrypoints.cli_jobs import cmd_config_check
from app.entrypoints.cli_output import EXIT_SETTINGS
from app.local import nvflare as nvflare_local
from app.local.nvflare import Deployment
from app.settings import Settings
from app.usecases import records
from models import NetState

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def foreign_deployment(tmp_path_factory: pytest.TempPathFactory) -> Deployment:
    """Another project on its own port: its admin kit dials another server."""
    return nvflare_local.provision(tmp_path_factory.mktemp("foreign"), project="foreign")


def _settings(tmp_path: Path, server: Deployment, admin: Deployment) -> Settings:
    net = {
        "name": "local-net",
        "driver": {"kind": "local", "server_kit_dir": str(server.server_kit)},
        "admin": {"kit_dir": str(admin.admin_kit), "username": admin.admin_user},
        "required_sites": list(server.sites),
    }
    return Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        NETS=json.dumps([net]),
        PER_JOB_FL_SERVER="true",
    )


def test_the_nets_own_kit_is_fine(tmp_path, nvflare_deployment):
    settings = _settings(tmp_path, nvflare_deployment, nvflare_deployment)
    assert kit_endpoint_problem(settings.net("local-net")) is None


def test_a_kit_for_another_server_is_reported_by_config_check(
    tmp_path, nvflare_deployment, foreign_deployment, capsys
):
    settings = _settings(tmp_path, nvflare_deployment, foreign_deployment)
    problem = kit_endpoint_problem(settings.net("local-net"))
    assert problem is not None
    assert f":{foreign_deployment.port}" in problem and f":{nvflare_deployment.port}" in problem
    assert cmd_config_check(_args(json=False), settings) == EXIT_SETTINGS
    assert "another project" in capsys.readouterr().err


def test_worker_start_takes_the_net_out_of_service(
    tmp_path, nvflare_deployment, foreign_deployment
):
    settings = _settings(tmp_path, nvflare_deployment, foreign_deployment)
    from app.migrate import upgrade

    upgrade(settings.database_url)
    prepare_nets_at_start(settings)
    sessions = session_factory(make_engine(settings.database_url))
    with sessions() as session:
        net = records.get_net(session, "local-net")
        assert net.state == NetState.MISCONFIGURED
        assert "dials" in (net.last_error or "")


def _args(**kw):
    import argparse

    return argparse.Namespace(**kw)
