"""Review 22: numeric arguments of the operator's commands that end in a traceback.

Promise (app/entrypoints/cli.py, the module docstring and `main`; review 21's
test_cli_bad_input.py for `jobs --limit`): a bad argument is a clear error line (exit 1, or
argparse's 2), never a traceback. Exit codes: 0 ok, 1 the command failed, 2 settings.

Each test gives one command a number its option's type (`float`, `int`) takes but the code
behind it cannot use, and checks the command answers with an error line or argparse's exit
2. What happened, on the code before any fix:
- `status --probe-timeout inf` (or 1e400): OverflowError out of threading's wait
  ("timestamp out of range for platform time_t"), a traceback, exit 1;
- `ready --timeout inf`, the healthcheck command: the same OverflowError;
- `api --port 99999`: OverflowError out of uvicorn's bind ("port must be 0-65535") after
  the whole app was built;
- `worker --concurrency -1`: click's BadParameter out of Celery's own option parsing;
- `demo --idle-gap nan` (or -1): accepted; the demo provisions NVFLARE, starts worker, beat
  and sites, runs its whole first job (about a minute), then dies in `time.sleep(nan)` with
  ValueError, a traceback, its second job never run.
"""

from __future__ import annotations

import sys

import pytest

from app.entrypoints.cli import build_parser, main
from tests.unit.test_cli import _isolated_logging, cli_env, db, world  # noqa: F401


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the command; it must refuse with exit 2 (argparse) or 1 and an error line, and
    raise nothing else. Its stderr."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse refusing the value
        assert exc.code == 2, exc.code
        return capsys.readouterr().err
    err = capsys.readouterr().err
    assert code != 0, f"`{' '.join(argv)}` accepted"
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("timeout", ["inf", "1e400"])
def test_status_with_an_endless_probe_deadline_is_an_error_line(
    capsys,
    world,  # noqa: F811
    timeout: str,
) -> None:
    """`fl-dispatcher status --probe-timeout inf`: OverflowError, a traceback."""
    _refused(capsys, "status", "--probe-timeout", timeout)


def test_ready_with_an_endless_timeout_is_an_error_line(capsys, db) -> None:  # noqa: F811
    """`fl-dispatcher ready --timeout inf` (compose's beat healthcheck command): OverflowError."""
    _refused(capsys, "ready", "--timeout", "inf")


def test_api_on_a_port_no_socket_has_is_an_error_line(capsys, db) -> None:  # noqa: F811
    """`fl-dispatcher api --port 99999`: OverflowError out of uvicorn's bind."""
    _refused(capsys, "api", "--port", "99999")


def test_worker_with_a_negative_concurrency_is_an_error_line(capsys, db) -> None:  # noqa: F811
    """`fl-dispatcher worker --concurrency -1`: click.BadParameter out of Celery."""
    _refused(capsys, "worker", "--concurrency", "-1")


@pytest.mark.parametrize("gap", ["nan", "-1"])
def test_demo_refuses_an_idle_gap_it_cannot_sleep_before_it_starts_anything(
    capsys,
    monkeypatch,
    cli_env,  # noqa: F811
    gap: str,
) -> None:
    """`fl-dispatcher demo --idle-gap nan`: the demo's stack (NVFLARE provisioned, worker,
    beat, sites, the first job) is started before `time.sleep(nan)` raises. Here the stack
    is a stand-in that says so instead of starting anything."""
    import app.local.demo as demo

    class NoStack:
        def __init__(self, *_: object, **__: object) -> None:
            raise AssertionError(f"the demo started its stack with --idle-gap {gap}")

    monkeypatch.setattr(demo, "LocalStack", NoStack)
    # run_demo's `out` defaults to the sys.stdout of its import: this test's capture.
    monkeypatch.setitem(demo.run_demo.__kwdefaults__, "out", sys.stdout)
    _refused(capsys, "demo", "--idle-gap", gap)


@pytest.mark.parametrize("timeout", ["nan", "-1", "0"])
def test_status_with_a_probe_deadline_no_probe_can_meet_is_an_error_line(
    capsys,
    world,  # noqa: F811
    timeout: str,
) -> None:
    """`fl-dispatcher status --probe-timeout nan` (or -1, 0): every net's probe reported
    "timed out", exit 0, as if every server were unreachable."""
    err = _refused(capsys, "status", "--probe-timeout", timeout)
    assert "--probe-timeout" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["ready", "--beat-ticked-within", "nan"],  # every age passed `age > nan`: "ticking"
        ["ready", "--timeout", "-1"],
        ["drain", "--all", "--wait", "nan"],  # drained, then "not complete after nans"
        ["drain", "--all", "--wait", "inf"],
        ["worker", "--wait", "inf"],
        ["api", "--port", "0"],
        ["db", "upgrade", "--wait", "-5"],
        ["demo", "--idle-gap", "inf"],
        ["simulate", "--synthetic", "--days", "inf"],  # generated a trace for ever
        ["simulate", "--synthetic", "--workers", "0"],
        ["simulate", "--synthetic", "--wait-budget", "nan"],  # "within the budget (nans)"
    ],
    ids=" ".join,
)
def test_every_number_option_refuses_what_its_command_cannot_use(capsys, argv: list[str]) -> None:
    """The same shared types on every door: argparse's exit 2 and a line naming the option,
    before the command starts anything (the parser alone, as `main` runs it first)."""
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(argv)
    assert refused.value.code == 2
    assert argv[-2] in capsys.readouterr().err
