"""The ECS fl-server service of the deployment guide (app/deploy/ecs): the Terraform module is
valid against the AWS provider's schema (`terraform validate`), and the ECS driver, built
from the nets entry of app/deploy/examples/nets.ecs.toml, scales a service shaped as the
module makes it (its container definitions, created at zero) up and back down, on moto."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import boto3
import pytest

from app.adapters.drivers.base import Observation
from app.adapters.drivers.ecs import EcsDriver
from app.net_config import EcsDriverConfig
from tests.fixtures.aws import MOTO_REGION
from tests.unit.test_deploy_examples import containers

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "app" / "deploy" / "ecs"
NETS = ROOT / "app" / "deploy" / "examples" / "nets.ecs.toml"
# A provider folder as `terraform init -plugin-dir` takes it (no network: the tests never
# download a provider).
PLUGIN_DIR = Path(os.environ.get("FL_TERRAFORM_PLUGIN_DIR", "/opt/tf-plugins"))


def terraform_or_skip() -> str:
    terraform = shutil.which("terraform")
    if terraform is None or not (PLUGIN_DIR / "registry.terraform.io/hashicorp/aws").is_dir():
        pytest.skip(
            f"terraform or its AWS provider under {PLUGIN_DIR} is missing "
            "(FL_TERRAFORM_PLUGIN_DIR): the module's schema is not checked here"
        )
    return terraform


def test_the_module_is_valid_against_the_aws_provider_schema(tmp_path):
    terraform = terraform_or_skip()
    work = tmp_path / "module"
    shutil.copytree(MODULE, work)
    env = os.environ | {"TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}
    init = subprocess.run(
        [terraform, "init", "-backend=false", f"-plugin-dir={PLUGIN_DIR}", "-input=false"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert init.returncode == 0, init.stdout + init.stderr
    validate = subprocess.run(
        [terraform, "validate", "-json", "-no-color"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = json.loads(validate.stdout)
    assert report["valid"] and report["warning_count"] == 0, report["diagnostics"]


def test_the_driver_of_the_nets_example_scales_the_service_the_module_makes(moto_endpoint):
    (net,) = tomllib.loads(NETS.read_text())["nets"]
    driver_fields = net["driver"] | {"region": MOTO_REGION, "endpoint_url": moto_endpoint}
    config = EcsDriverConfig.model_validate(driver_fields)
    ecs: Any = boto3.session.Session().client(
        "ecs", region_name=MOTO_REGION, endpoint_url=moto_endpoint
    )
    ecs.create_cluster(clusterName=config.cluster)
    ecs.register_task_definition(
        family=f"fl-server-{net['name']}",
        requiresCompatibilities=["FARGATE"],
        networkMode="awsvpc",
        cpu="1024",
        memory="4096",
        containerDefinitions=containers(),
    )
    ecs.create_service(  # as fl-server.tf creates it
        cluster=config.cluster,
        serviceName=f"fl-server-{net['name']}",
        taskDefinition=f"fl-server-{net['name']}",
        desiredCount=0,
        launchType="FARGATE",
        deploymentConfiguration={"minimumHealthyPercent": 0, "maximumPercent": 100},
    )
    driver = EcsDriver(config)
    assert driver.observe() == Observation(desired=0, running=0, pending=0)
    driver.scale(1)
    assert driver.observe().is_up
    driver.scale(0)
    assert driver.observe() == Observation(desired=0, running=0, pending=0)
