"""The one attempt count every door shows (CLI, status API, nets page, callbacks).

A job row counts the attempts it has used up (`jobs.attempts`, and `job_events.attempt` at
each move): 0 while its first attempt runs. People read "attempt 1 of 3" for that, so every
view shows the attempt the job is on, or ended on, counted from 1 and never past its
`max_attempts` (a job FAILED with `max_attempts` used up all of them: "3 of 3").
"""

from __future__ import annotations


def attempt_number(used: int, max_attempts: int) -> int:
    """The attempt a job with `used` attempts used up is on or ended on, from 1 to
    `max_attempts`."""
    return max(1, min(used + 1, max_attempts))
