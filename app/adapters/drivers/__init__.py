"""Scale drivers: how a net's fl-server gets 0 or 1 replicas (see `base.ScaleDriver`)."""

from __future__ import annotations

from app.adapters.drivers.base import Observation, ScaleDriver
from app.adapters.drivers.static import StaticDriver
from app.net_config import (
    DockerDriverConfig,
    EcsDriverConfig,
    FlowerLocalDriverConfig,
    LocalDriverConfig,
    NetConfig,
    StaticDriverConfig,
)
from app.settings import Settings

__all__ = ["Observation", "ScaleDriver", "build_driver"]


def build_driver(net: NetConfig, settings: Settings) -> ScaleDriver:
    """The driver for one net, from its validated config.

    An always-on net (`net.always_on`) still gets its real driver: the
    dispatcher never calls `scale` on it, but `observe` keeps reporting what the platform
    sees, which is how an OUTAGE is told apart from a stopped service.

    Each call builds a new driver: build once per net and process, not once per task. ECS
    nets on one cluster share one boto3 client (and session and service model) per process,
    and are observed 10 per DescribeServices call inside an observation pass.
    """
    config = net.driver
    # Adapters are imported only when a net uses them, so a laptop with local nets never
    # imports boto3 and an ECS deployment never imports the process manager or the docker SDK.
    if isinstance(config, EcsDriverConfig):
        from app.adapters.drivers.ecs import driver_for

        return driver_for(net, settings)
    if isinstance(config, StaticDriverConfig):
        return StaticDriver(net.name)
    if isinstance(config, LocalDriverConfig):
        from app.adapters.drivers.local import LocalDriver

        driver: ScaleDriver = LocalDriver(
            net.name, config.server_kit_dir, settings.data_dir / "local-driver"
        )
        return driver
    if isinstance(config, FlowerLocalDriverConfig):
        from app.adapters.drivers.local_superlink import superlink_driver

        return superlink_driver(net, config, settings)
    if isinstance(config, DockerDriverConfig):
        from app.adapters.drivers.docker import DockerDriver

        return DockerDriver(net.name, config)
    raise TypeError(f"net {net.name!r}: unknown driver config {type(config).__name__}")
