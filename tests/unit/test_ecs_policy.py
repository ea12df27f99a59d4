"""The shipped IAM policy file is exactly what `iam_policy_for` renders, so they never drift."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from app.adapters.drivers.ecs import iam_policy_for
from app.net_config import NetConfig

SHIPPED = resources.files("app") / "policies" / "ecs-scale-policy.json"


@pytest.fixture
def admin_kit(tmp_path: Path) -> Path:
    (tmp_path / "admin" / "startup").mkdir(parents=True)
    (tmp_path / "admin" / "startup" / "fed_admin.json").write_text("{}")
    return tmp_path / "admin"


def _net(admin_kit: Path, name: str, driver: dict[str, Any]) -> NetConfig:
    return NetConfig.model_validate(
        {"name": name, "driver": driver, "admin": {"kit_dir": admin_kit, "username": "admin"}}
    )


def _ecs(region: str, cluster: str, service: str) -> dict[str, str]:
    return {"kind": "ecs", "region": region, "cluster": cluster, "service": service}


def test_shipped_policy_equals_the_rendering_for_placeholders(admin_kit: Path) -> None:
    net = _net(admin_kit, "any", _ecs("<region>", "<cluster>", "<service>"))

    rendered = iam_policy_for([net], "<account-id>")

    assert json.loads(SHIPPED.read_text()) == rendered


def test_policy_allows_two_actions_on_each_ecs_service_only(admin_kit: Path) -> None:
    nets = [
        _net(admin_kit, "net-b", _ecs("eu-west-2", "flip", "fl-server-b")),
        _net(admin_kit, "net-a", _ecs("eu-west-2", "flip", "fl-server-a")),
        _net(admin_kit, "net-a-again", _ecs("eu-west-2", "flip", "fl-server-a")),
        _net(admin_kit, "net-cn", _ecs("cn-north-1", "flip", "fl-server-c")),
        _net(admin_kit, "always-on", {"kind": "static"}),
    ]

    policy = iam_policy_for(nets, "123456789012")

    assert policy["Version"] == "2012-10-17"
    [statement] = policy["Statement"]
    assert statement["Effect"] == "Allow"
    assert statement["Action"] == ["ecs:DescribeServices", "ecs:UpdateService"]
    assert statement["Resource"] == [
        "arn:aws-cn:ecs:cn-north-1:123456789012:service/flip/fl-server-c",
        "arn:aws:ecs:eu-west-2:123456789012:service/flip/fl-server-a",
        "arn:aws:ecs:eu-west-2:123456789012:service/flip/fl-server-b",
    ]
    assert "*" not in json.dumps(policy)


def test_no_ecs_net_means_no_policy(admin_kit: Path) -> None:
    with pytest.raises(ValueError, match="no net uses the ecs driver"):
        iam_policy_for([_net(admin_kit, "always-on", {"kind": "static"})], "123456789012")


ARN = "arn:aws:ecs:eu-west-2:123456789012"


@pytest.mark.parametrize(
    ("cluster", "service"),
    [
        ("flip", f"{ARN}:service/flip/fl-server-a"),  # Terraform's aws_ecs_service.id
        (f"{ARN}:cluster/flip", f"{ARN}:service/fl-server-a"),  # the older service ARN
    ],
)
def test_a_service_given_by_its_arn_is_the_service_of_that_name(
    admin_kit: Path, cluster: str, service: str
) -> None:
    """app/README.md: the cluster and service "by name or ARN": the policy names the service
    (not the ARN nested in another: service/flip/arn:aws:ecs:...), as ECS's answers do."""
    net = _net(admin_kit, "net-a", _ecs("eu-west-2", cluster, service))

    assert (net.driver.cluster, net.driver.service) == ("flip", "fl-server-a")
    assert iam_policy_for([net], "123456789012")["Statement"][0]["Resource"] == [
        f"{ARN}:service/flip/fl-server-a"
    ]


@pytest.mark.parametrize(
    ("cluster", "service", "refused"),
    [
        ("flip", "arn:aws:ecs:eu-west-1:123456789012:service/flip/x", "region 'eu-west-1'"),
        ("flip", f"{ARN}:service/other/x", "in cluster 'other', not 'flip'"),
        ("flip", f"{ARN}:cluster/flip", "not an ECS service ARN"),
        (f"{ARN}:service/flip/x", "x", "not an ECS cluster ARN"),
        ("flip", "arn:aws:s3:::bucket/x", "not an ECS service ARN"),
        ("flip", "flip/x", "a name has no '/'"),
    ],
)
def test_an_arn_that_is_not_the_nets_own_is_refused_with_the_reason(
    admin_kit: Path, cluster: str, service: str, refused: str
) -> None:
    with pytest.raises(ValueError, match=refused.replace("(", r"\(")):
        _net(admin_kit, "net-a", _ecs("eu-west-2", cluster, service))
