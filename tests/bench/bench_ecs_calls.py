"""Benchmark (not a test): ECS API calls per pass over many nets, against moto's server.

    .venv/bin/python -m tests.bench.bench_ecs_calls [--nets 10,100,1000] [--json]

moto's ECS server runs in a thread on loopback (as in tests/fixtures/aws.py) with one
service per net in one cluster; every net uses the real EcsDriver (built by build_driver)
pointed at it, the admin client is the fake. The world is the beat-tick benchmark's (10%
BUSY with a running job, 10% READY idle, the rest STOPPED; PostgreSQL). Passes counted:
- reconcile: what beat's reconcile task runs (the reconcile handler in app/handlers.py);
- /fl/status: the status view probing every net (app.entrypoints.api.collect_status).
Calls are counted in botocore (every client in this process). Goal: DescribeServices batched
10 services a call, so at most 100 calls per pass at 1,000 nets. The process's peak RSS is
reported too (the ECS clients of every net live in it).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from botocore.client import BaseClient

from app import names
from app.entrypoints.api import Prober, collect_status
from tests.bench.bench_beat_tick import World
from tests.bench.common import (
    Timing,
    common_args,
    environment,
    int_list,
    pg_database,
    print_table,
    ratio,
)

REGION = "eu-west-2"
CLUSTER = "flip"
BATCH = 10  # DescribeServices takes at most 10 services


@contextmanager
def moto_ecs() -> Iterator[str]:
    """moto's server on 127.0.0.1 and a free port, dummy credentials, no ~/.aws."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise

    with tempfile.TemporaryDirectory() as empty:
        os.environ.update(
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_SESSION_TOKEN="testing",
            AWS_DEFAULT_REGION=REGION,
            AWS_EC2_METADATA_DISABLED="true",
            AWS_CONFIG_FILE=str(Path(empty) / "config"),
            AWS_SHARED_CREDENTIALS_FILE=str(Path(empty) / "credentials"),
        )
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


class ApiCalls:
    """Counts ECS API calls made by any botocore client in this process."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._original: Callable[..., Any] | None = None

    @contextmanager
    def counting(self) -> Iterator[Counter[str]]:
        original = BaseClient._make_api_call
        calls = self.calls = Counter()

        def counted(client: Any, operation: str, params: Any) -> Any:
            calls[operation] += 1
            return original(client, operation, params)

        BaseClient._make_api_call = counted  # type: ignore[method-assign]
        try:
            yield calls
        finally:
            BaseClient._make_api_call = original  # type: ignore[method-assign]


def create_services(endpoint: str, world: World) -> None:
    ecs = boto3.session.Session().client("ecs", region_name=REGION, endpoint_url=endpoint)
    ecs.create_cluster(clusterName=CLUSTER)
    ecs.register_task_definition(
        family="fl-server",
        requiresCompatibilities=["FARGATE"],
        networkMode="awsvpc",
        cpu="2048",
        memory="8192",
        containerDefinitions=[{"name": "fl-server", "image": "nvflare:2.9", "essential": True}],
    )
    for name in world.names:
        service = f"fl-{name}"
        ecs.create_service(
            cluster=CLUSTER,
            serviceName=service,
            taskDefinition="fl-server",
            desiredCount=0,
            launchType="FARGATE",
        )
        if name not in world.stopped:  # UpdateService makes moto run the task at once
            ecs.update_service(cluster=CLUSTER, service=service, desiredCount=1)


def reconcile_pass(world: World) -> Any:
    from tasks.base import set_runtime
    from tasks.registered import TASKS

    set_runtime(world.rt)
    try:
        return TASKS[names.RECONCILE]()
    finally:
        set_runtime(None)


def status_pass(world: World) -> Any:
    return collect_status(world.rt, Prober(), timeout_s=60.0)


PASSES: dict[str, Callable[[World], Any]] = {"reconcile": reconcile_pass, "status": status_pass}


def run(n_nets: int, endpoint: str) -> dict[str, Any]:
    with pg_database() as url, tempfile.TemporaryDirectory() as tmp:
        world = World(url, Path(tmp), n_nets, finished_per_net=0, ecs_endpoint=endpoint)
        try:
            create_services(endpoint, world)
            counter = ApiCalls()
            result: dict[str, Any] = {"nets": n_nets, "passes": {}}
            for name, run_pass in PASSES.items():
                run_pass(world)  # warm-up: clients built, connections open
                timing = Timing()
                with counter.counting() as calls:
                    timing.measure(lambda run_pass=run_pass: run_pass(world))
                result["passes"][name] = {
                    "DescribeServices": calls["DescribeServices"],
                    "other_calls": sum(calls.values()) - calls["DescribeServices"],
                    "ms": timing.median_ms,
                }
            result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
            return result
        finally:
            world.close()


def main() -> None:
    parser = common_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    parser.add_argument("--nets", type=int_list, default=[10, 100, 1000])
    args = parser.parse_args()
    with moto_ecs() as endpoint:
        results = [run(n, endpoint) for n in args.nets]
    if args.json:
        print(json.dumps({"benchmark": "ecs_calls", "env": environment(), "results": results},
                         indent=2))  # fmt: skip
        return
    rows = []
    for r in results:
        goal = math.ceil(r["nets"] / BATCH)
        for name, p in r["passes"].items():
            calls = p["DescribeServices"]
            rows.append(
                [r["nets"], name, calls, goal, ratio(calls, goal), p["other_calls"], p["ms"],
                 r["peak_rss_mib"]]
            )  # fmt: skip
    print_table(
        f"ECS calls per pass (moto server on loopback; goal: ceil(nets/10) DescribeServices) "
        f"{environment()}",
        [
            "nets",
            "pass",
            "DescribeServices",
            "goal",
            "vs goal",
            "other calls",
            "pass ms",
            "peak RSS MiB",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
