"""Break-it 22b: `local-net`'s number options are outside the shared CLI number types.

Promise (app/entrypoints/README.md "CLI", 0.3.11's changelog "Operator doors"): "every number
option of the CLI is checked before anything starts ... a number an option cannot use is
argparse's (exit 2) before anything starts (app/entrypoints/cli_args.py: ... a port
1..65535; a count of processes 1..1024)".

Scenario: `fl-dispatcher local-net DIR --sites 100000` (a typo for 10, or 1e5 pasted), and
`local-net DIR --port 99999`.

What happened: both options are plain `type=int`. `--sites 100000` is taken: the command
provisions a hundred thousand site kits (certificates and keys each; stopped here after
120 s, still provisioning), sites an operator starts as a process each. `--port 99999` is
refused, but by the command (exit 1), not argparse's exit 2 as for `api --port 99999`.
"""

from __future__ import annotations

import pytest

from app.entrypoints.cli import build_parser


@pytest.mark.parametrize(
    "argv",
    [
        ["local-net", "net-folder", "--sites", "100000"],
        ["local-net", "net-folder", "--port", "99999"],
    ],
    ids=" ".join,
)
def test_local_nets_numbers_are_refused_by_the_parser(capsys, argv: list[str]) -> None:
    """The parser alone, as `main` runs it first: exit 2 and a line naming the option."""
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(argv)
    assert refused.value.code == 2
    assert argv[-2] in capsys.readouterr().err
