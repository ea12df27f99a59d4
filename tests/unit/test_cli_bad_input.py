"""The operator's doors (settings redaction, the CLI; review 21, each test failing on the code
before its fix): bad input gets a clear error, never a traceback, and no secret is printed.

- `config check` promises "the effective configuration, secrets redacted" (README
  "Configuration essentials"). A Redis BROKER_URL whose password holds an '@' is one kombu
  reads whole (urllib splits the user info at the last '@'), but `redact_url` masks only
  up to the first '@', so the rest of the password is printed. CALLBACK_URL refuses such a
  URL for this very reason (settings._callback_url); BROKER_URL and DATABASE_URL do not.
- `jobs --limit 0` (or a negative limit): `page_jobs` slices the page to nothing and then
  reads its last job for the cursor: IndexError, a traceback instead of an error line.
- `abort ID --reason <over 500 characters>`: `AbortJob` refuses it with a pydantic
  ValidationError that `main` does not catch (enqueue and prewarm catch theirs): a
  traceback instead of "fl-dispatcher: ..." and exit 1.
"""

from __future__ import annotations

import uuid

from kombu.utils.url import url_to_parts

from app.settings import Settings
from tests.unit.test_cli import _isolated_logging, cli_env, db, run, world  # noqa: F401

BROKER_PASSWORD = "p@ss-tail-9f3e"


def test_config_check_masks_a_redis_password_that_holds_an_at_sign(tmp_path) -> None:
    """Scenario: BROKER_URL=redis://:p@ss-tail-9f3e@redis:6379/0, a URL kombu connects with
    (password read whole). Promise: `config check` prints no secret. Broke: redacted() shows
    redis://:***@ss-tail-9f3e@redis:6379/0."""
    url = f"redis://:{BROKER_PASSWORD}@redis:6379/0"
    assert url_to_parts(url).password == BROKER_PASSWORD  # the broker client reads it whole
    settings = Settings(FL_DISPATCHER_DATA_DIR=tmp_path, BROKER_URL=url)
    shown = settings.redacted()["BROKER_URL"]
    assert "ss-tail-9f3e" not in shown, shown


def test_jobs_with_limit_zero_is_an_error_line_not_a_traceback(capsys, db, world) -> None:  # noqa: F811
    """Scenario: `fl-dispatcher jobs --limit 0` with jobs stored. Promise: a bad argument is
    a clear error (exit 1 or argparse's 2), never a crash. Broke: IndexError out of
    views.page_jobs (`_encode_cursor(jobs[-1])` on an empty page)."""
    try:
        code, _, err = run(capsys, "jobs", "--limit", "0")
    except SystemExit as exc:  # argparse refusing the value is fine too
        assert exc.code == 2
        return
    except IndexError as exc:
        raise AssertionError(f"jobs --limit 0 crashed: IndexError: {exc}") from None
    assert code != 0 and "limit" in err


def test_abort_with_an_overlong_reason_is_an_error_line_not_a_traceback(capsys, db, world) -> None:  # noqa: F811
    """Scenario: `fl-dispatcher abort ID --reason <501 characters>`. Promise (as enqueue's
    and prewarm's CLI doors do): the field's problem on stderr, exit 1. Broke: an uncaught
    pydantic ValidationError out of cmd_abort."""
    from pydantic import ValidationError

    try:
        code, _, err = run(capsys, "abort", str(uuid.uuid4()), "--reason", "x" * 501)
    except ValidationError as exc:
        raise AssertionError(f"abort crashed: {type(exc).__name__}") from None
    assert code == 1 and "reason" in err
