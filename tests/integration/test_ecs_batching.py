"""1,000 ECS nets against moto's server over real HTTP on loopback: every pass that observes
many nets (beat's reconcile task, the status view, Runtime.observe_many) reads them with at
most one DescribeServices call per 10 services, and each net still gets its own service's
answer. Calls are counted where botocore makes them, for every client in the process.

The drivers are the real ones (build_driver), sharing one client per cluster; the admin
client is never needed (every net is a STOPPED scale-to-zero net), so it is a stand-in.
"""

from __future__ import annotations

import json
import math
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.client import BaseClient

from app import migrate, names
from app.adapters.drivers import Observation
from app.db import unit_of_work
from app.parallel import Prober
from app.runtime import Runtime
from app.settings import Settings
from app.usecases import declared_nets
from app.usecases.views import collect_status
from tests.fixtures.aws import MOTO_REGION
from tests.fixtures.db import fresh_pg_database, make_admin_kit

pytestmark = pytest.mark.integration

NETS = 1000
CLUSTER = "flip-nets"
LIMIT = math.ceil(NETS / 10)


def _desired(i: int) -> int:
    return 1 if i % 3 == 0 else 0


@pytest.fixture(scope="module")
def endpoint(moto_server: str) -> Iterator[str]:
    """moto with one cluster of 1,000 services (every third scaled to one task)."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": MOTO_REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": "/nonexistent/aws-config",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
        }.items():
            env.setenv(name, value)
        reset = urllib.request.Request(f"{moto_server}/moto-api/reset", method="POST")
        with urllib.request.urlopen(reset, timeout=10):
            pass
        ecs = boto3.session.Session().client(
            "ecs", region_name=MOTO_REGION, endpoint_url=moto_server
        )
        ecs.create_cluster(clusterName=CLUSTER)
        ecs.register_task_definition(
            family="fl-server",
            requiresCompatibilities=["FARGATE"],
            networkMode="awsvpc",
            cpu="2048",
            memory="8192",
            containerDefinitions=[{"name": "fl-server", "image": "nvflare:2.9", "essential": True}],
        )
        for i in range(NETS):
            service = f"fl-server-{i:04d}"
            ecs.create_service(
                cluster=CLUSTER,
                serviceName=service,
                taskDefinition="fl-server",
                desiredCount=0,
                launchType="FARGATE",
            )
            if _desired(i):
                ecs.update_service(cluster=CLUSTER, service=service, desiredCount=1)
        yield moto_server


@pytest.fixture(scope="module")
def rt(endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    """A runtime with 1,000 ECS nets (all STOPPED, scale to zero) on a fresh database."""
    tmp = tmp_path_factory.mktemp("ecs-batching")
    kit = make_admin_kit(tmp / "admin")
    nets = [
        {
            "name": f"net-{i:04d}",
            "driver": {
                "kind": "ecs",
                "region": MOTO_REGION,
                "cluster": CLUSTER,
                "service": f"fl-server-{i:04d}",
                "endpoint_url": endpoint,
            },
            "admin": {"kit_dir": str(kit), "username": "admin"},
            "required_sites": ["site-1"],
        }
        for i in range(NETS)
    ]
    with fresh_pg_database("fld_ecs") as url:
        migrate.upgrade(url)
        settings = Settings(
            DATABASE_URL=url,
            FL_DISPATCHER_DATA_DIR=Path(tmp / "data"),
            NETS=json.dumps(nets),
            PER_JOB_FL_SERVER="true",
        )

        def no_admin(net: Any, _settings: Any) -> Any:
            raise AssertionError(f"{net.name}: a STOPPED scale-to-zero net is never contacted")

        runtime = Runtime.from_settings(settings, admin_factory=no_admin)
        with unit_of_work(runtime.sessions) as session:
            declared_nets.sync_nets(session, settings, runtime.clock())
        yield runtime
        runtime.close()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    counted: Counter[str] = Counter()
    original = BaseClient._make_api_call

    def counting(client: Any, operation: str, params: Any) -> Any:
        counted[operation] += 1
        return original(client, operation, params)

    monkeypatch.setattr(BaseClient, "_make_api_call", counting)
    return counted


def _expected(name: str) -> Observation:
    up = _desired(int(name.removeprefix("net-")))
    return Observation(desired=up, running=up, pending=0)


def test_observe_many_reads_ten_services_a_call(rt: Runtime, calls: Counter[str]) -> None:
    names = [n.name for n in rt.settings.nets]

    seen = rt.observe_many(names)

    assert calls["DescribeServices"] == LIMIT
    assert seen == {name: _expected(name) for name in names}


def test_beat_reconcile_pass_reads_ten_services_a_call(rt: Runtime, calls: Counter[str]) -> None:
    from tasks.base import set_runtime
    from tasks.registered import TASKS

    set_runtime(rt)
    try:
        TASKS[names.RECONCILE]()
    finally:
        set_runtime(None)

    assert 0 < calls["DescribeServices"] <= LIMIT
    assert calls["UpdateService"] == 0  # nothing drifted long enough to be repaired


def test_status_view_reads_ten_services_a_call(rt: Runtime, calls: Counter[str]) -> None:
    status = collect_status(rt, Prober(), timeout_s=120)

    assert calls["DescribeServices"] == LIMIT
    views = {v.name: v for v in status.nets}
    assert len(views) == NETS
    for name, view in views.items():
        expected = _expected(name)
        assert view.driver is not None
        assert view.driver.model_dump() == {
            "desired": expected.desired,
            "running": expected.running,
            "pending": 0,
            "failure": None,
        }, name
        assert view.error is None


def test_outside_a_pass_a_net_is_read_alone(rt: Runtime, calls: Counter[str]) -> None:
    assert rt.driver("net-0003").observe() == _expected("net-0003")
    assert calls["DescribeServices"] == 1
