"""What tasks/README.md tells an operator to look for when a message kills every worker that
takes it ('the WARNING lines with a growing `<field>` for one task id'), checked against
the lines `SentAgainRequest` (tasks/base.py) writes for three losses of one message. Written
by a reviewer of 667b8e5, whose README named `retries` (left alone by design) where the line
carries `losses`; the same review found its "at most once a RETRY_BACKOFF_MAX_S" wrong under
full jitter (the README now says what the jitter does)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.unit.celery_process import run_script

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "tasks" / "README.md"

LOSE_TWICE = """
import json, logging, random
from app import names
from app.celery_app import celery
from tasks.base import SentAgainRequest
from tasks.registered import TASKS

lines = []


class Keep(logging.Handler):
    def emit(self, record):
        if record.getMessage() == "worker lost holding a message: sent again":
            lines.append({k: v for k, v in record.__dict__.items() if isinstance(v, int)})


logging.getLogger("tasks.base").addHandler(Keep())
task = TASKS[names.ENQUEUE_JOB]
task.apply_async(kwargs={"payload": {"caller_key": "k"}}, queue=names.QUEUE, retries=2)
random.seed(3)
with celery.connection_for_read() as conn:
    queue = conn.SimpleQueue(names.QUEUE)
    for _ in range(3):  # the same poison request, killed at its hard time limit each time
        message = queue.get(timeout=90)
        request = SentAgainRequest(
            message, app=celery, task=task,
            on_ack=message.ack_log_error, on_reject=message.reject_log_error,
        )
        request.on_timeout(False, 360)
    queue.get(timeout=90).ack()
    queue.close()
print(json.dumps(lines))
"""


def test_the_field_the_readme_says_grows_on_a_poison_messages_warning_lines_grows(
    tmp_path: Path,
) -> None:
    """An operator told to look for a growing `retries` on the WARNING lines of one task id
    finds no such field on `worker lost holding a message: sent again`, nor one that grows:
    the losses are counted apart, and the retries are left as they were."""
    text = " ".join(README.read_text().split())
    found = re.search(r"WARNING lines with a growing `(\w+)` for one task id", text)
    assert found is not None
    field = found.group(1)
    lines: list[dict[str, Any]] = run_script(LOSE_TWICE, [], tmp_path, backoff_max_s=1)
    assert len(lines) == 3
    assert all(field in line for line in lines), (field, lines)
    values = [int(line[field]) for line in lines]
    assert values == sorted(values) and len(set(values)) == 3, (field, values)
