"""An always-on replica that crashes soon after each start: reconcile flips its net READY ->
OUTAGE -> (replica asked for again) READY -> OUTAGE ..., each OUTAGE shorter than the 5
minutes `FlDispatcherNetOutage` waits, so an alert on "in OUTAGE for 5 min" alone never
fires though the net is never up long enough to be of use. The net's OUTAGE gauge, scraped
once a minute from the service's own /metrics families through an hour of it, is fed to
`promtool test rules` with the shipped rules: the alert must fire."""

from __future__ import annotations

from pathlib import Path

import yaml

from app.metrics.exposition import families
from app.metrics.read import read_snapshot
from app.usecases import reconciler
from models import NetState
from tests.unit.test_alert_rules import RULES, promtool, rules

BOOT_S = 120.0  # from the ask for its replica until the server answers
UP_S = 90.0  # then it answers this long and exits (a docker container: desired 0)
ROUND_S = 30  # reconcile's period with the default HOUSEKEEPING_INTERVAL_S
MINUTES = 60


def _outage_gauge(world) -> int:
    """What /metrics says now: fl_dispatcher_nets{net="net-a", state="OUTAGE"}."""
    with world.rt.sessions.begin() as session:
        snap = read_snapshot(session, world.clock())
    [nets] = [f for f in families(snap) if f.name == "fl_dispatcher_nets"]
    wanted = {"net": "net-a", "state": NetState.OUTAGE.value}
    return int(next(s.value for s in nets.samples if s.labels == wanted))


def _crash_loop(world) -> list[int]:
    """An hour of reconcile rounds on a replica that answers BOOT_S after each ask and exits
    UP_S later: the OUTAGE gauge at each minute."""
    driver, server = world.driver("net-a"), world.server("net-a")
    asked: list = []
    real = driver.scale

    def scale(replicas: int) -> None:
        real(replicas)
        if replicas:
            asked.append(world.clock())

    driver.scale = scale  # type: ignore[method-assign]
    samples = []
    for tick in range(MINUTES * 60 // ROUND_S + 1):
        age_s = (world.clock() - asked[-1]).total_seconds() if asked else None
        if age_s is not None and age_s >= BOOT_S + UP_S:
            driver.replicas = 0  # it exited: its replica reads as none wanted
        server.up = driver.replicas > 0 and age_s is not None and age_s >= BOOT_S
        reconciler.reconcile(world.rt)
        if tick % (60 // ROUND_S) == 0:
            samples.append(_outage_gauge(world))
        world.clock.advance(ROUND_S)
    return samples


def _longest_run(samples: list[int]) -> int:
    run = longest = 0
    for value in samples:
        run = run + 1 if value else 0
        longest = max(longest, run)
    return longest


def test_a_replica_that_crashes_after_each_start_pages(always_on, tmp_path: Path):
    samples = _crash_loop(always_on)
    # The loop it is: in and out of OUTAGE all hour, never 5 scrapes in a row in it.
    assert samples.count(1) > MINUTES // 3 and samples.count(0) > MINUTES // 6
    assert _longest_run(samples) < 5
    [rule] = [r for r in rules() if r["alert"] == "FlDispatcherNetOutage"]
    annotations = {
        key: text.replace("{{ $labels.net }}", "net-a") for key, text in rule["annotations"].items()
    }
    case = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": 'fl_dispatcher_nets{net="net-a", state="OUTAGE"}',
                        "values": " ".join(map(str, samples)),
                    }
                ],
                "alert_rule_test": [
                    {
                        "eval_time": f"{MINUTES}m",
                        "alertname": "FlDispatcherNetOutage",
                        "exp_alerts": [
                            {
                                "exp_labels": {"net": "net-a", "severity": "page"},
                                "exp_annotations": annotations,
                            }
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "crash_loop_test.yml"
    path.write_text(yaml.safe_dump(case))
    tested = promtool("test", "rules", path)
    by_minute = "".join(map(str, samples))
    assert tested.returncode == 0, f"OUTAGE by minute {by_minute}\n{tested.stdout}{tested.stderr}"
