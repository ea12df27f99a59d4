"""flip-api as the workload has it call: its prewarm hints and cancels, its enqueues, its
reports and aborts, each at its time or armed for the moment a job or a net reaches a state
(and sent then, at the very hook point or step it happens), every payload through a JSON
round trip as Celery carries it."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable

from app import names
from app.schemas import job_id_for
from app.sim.db import Unchanged
from app.sim.view import SimView
from app.sim.workload import JobSpec

# What an armed call waits for: a job (its id as stored, hex), a net ("net:<name>"), or a
# condition the harness reads (a callable; dropped at the horizon like a net's).
Subject = str | Callable[[], str]
Trigger = tuple[Subject, str, str, Callable[[], None]]


class Caller:
    """flip-api's calls of a workload, and the armed ones still waiting for their moment."""

    def __init__(self, sim: SimView) -> None:
        self.sim = sim
        self.triggers: list[Trigger] = []
        # The states read for the triggers, kept while no row changes: they are looked at
        # after every step and at every hook point (a fifth of a seed's statements).
        self._unchanged: Unchanged | None = None
        self._states: dict[str, tuple[str] | None] = {}

    def schedule_prewarms(self) -> None:
        """The hints and cancels (first: one sent at its job's submission goes before it)."""
        sim = self.sim
        for hint in sim.workload.prewarms:
            if hint.cancel:
                cancel = self.sender(names.CANCEL_PREWARM, {"caller_key": hint.key})
                sim.at(hint.at_s, f"flip-api cancels prewarm {hint.key}", cancel)
                continue
            prewarm: dict[str, object] = {
                "caller_key": hint.key,
                "within_s": float(hint.within_s),
                "required_sites": list(hint.sites),
            }
            if hint.net is not None:
                prewarm["net"] = hint.net
            label = f"flip-api prewarms for {hint.key}"
            send = self.sender(names.PREWARM, prewarm)
            if hint.on_state is not None and hint.net is not None:
                # Armed on the net's state (a "net:" subject), dropped at the horizon.
                arm = functools.partial(
                    self.arm, f"net:{hint.net}", hint.on_state, f"{label} on {hint.net}", send
                )
                sim.at(hint.at_s, f"{label} once {hint.net} is {hint.on_state}", arm)
                continue
            sim.at(hint.at_s, label, send)

    def schedule_calls(self) -> None:
        """The enqueues (but a burst's, which its burst sends) and the reports and aborts."""
        sim = self.sim
        sent_later = {k for b in sim.workload.bursts for k in (b.plain, b.hinted)}
        for job in sim.workload.jobs:
            if job.key in sent_later:
                continue
            payload = self.enqueue_payload(job)
            sim.at(
                job.arrive_s,
                f"flip-api enqueues {job.key}",
                self.sender(names.ENQUEUE_JOB, payload),
            )
        for event in sim.workload.events:
            job_id = str(job_id_for(event.key))
            if event.kind == "abort":
                task = names.ABORT_JOB
                payload = {"job_id": job_id, "reason": event.text or "aborted by the user"}
                label = f"flip-api aborts {event.key}"
            else:
                task = names.REPORT_JOB_STATUS
                payload = {"job_id": job_id, "status": event.status}
                if event.text:
                    payload["detail"] = event.text
                label = f"flip-api reports {event.key} {event.status}"
            if event.on_state is None:
                sim.at(event.at_s, label, self.sender(task, payload))
            else:
                send = self.sender(task, payload)
                sim.at(
                    event.at_s,
                    f"{label} once it is {event.on_state}",
                    functools.partial(self.arm, job_id, event.on_state, label, send),
                )

    def enqueue_payload(self, job: JobSpec) -> dict[str, object]:
        """flip-api's enqueue of the job, as Celery's JSON carries it."""
        payload: dict[str, object] = {
            "caller_key": job.key,
            "definition": job.definition,
            "required_sites": list(job.sites),
            "priority": job.priority,
        }
        if job.net is not None:
            payload["net"] = job.net
        if job.metadata is not None:
            payload["metadata"] = job.metadata
        if job.max_attempts is not None:
            payload["max_attempts"] = job.max_attempts
        if job.prewarm_key is not None:
            payload["prewarm_key"] = job.prewarm_key
        if job.project is not None and job.project_in_metadata:
            payload["metadata"] = {**(job.metadata or {}), "project_id": job.project}
        elif job.project is not None:
            payload["project_id"] = job.project
        sent: dict[str, object] = json.loads(json.dumps(payload))
        return sent

    def arm(self, subject: Subject, state: str, label: str, send: Callable[[], None]) -> None:
        """Send `send` the moment `subject` is in `state` (checked after every step and at
        every hook point outside a transaction)."""
        if isinstance(subject, str) and not subject.startswith("net:"):
            subject = subject.replace("-", "")
        self.triggers.append((subject, state, label, send))

    def fire_triggers(self) -> bool:
        """Send the caller events waiting for a job state the job is in right now."""
        sim = self.sim
        fired = False
        for trigger in list(self.triggers):
            if trigger not in self.triggers:
                continue  # fired by a message one of these ran at once (a claim's instant)
            subject, state, label, send = trigger
            if callable(subject):
                # A condition the harness reads (a burst's free nets): dropped at the horizon.
                if sim.draining:
                    self.triggers.remove(trigger)
                    continue
                row: tuple[str] | None = (subject(),)
            elif subject.startswith("net:"):
                # A prewarm armed on a net's state: the caller's hints stop at the horizon.
                if sim.draining:
                    self.triggers.remove(trigger)
                    continue
                row = self._state_of(subject, "SELECT state FROM nets WHERE name = ?", subject[4:])
            else:
                row = self._state_of(subject, "SELECT state FROM jobs WHERE id = ?", subject)
            if row is not None and row[0] == state:
                self.triggers.remove(trigger)
                sim.trace(f"== {label} (now {state})")
                send()
                fired = True
        return fired

    def _state_of(self, subject: str, query: str, key: str) -> tuple[str] | None:
        """The subject's state row as `query` reads it, or as it was read since the last
        change of any row."""
        conn = self.sim.conn
        if self._unchanged is None:
            self._unchanged = Unchanged(conn)
        if not self._unchanged.holds():
            self._states = {}
        if subject not in self._states:
            self._states[subject] = conn.execute(query, (key,)).fetchone()
        return self._states[subject]

    def sender(self, task: str, payload: dict[str, object]) -> Callable[[], None]:
        """A send of flip-api's call: what survives json.dumps (as kombu calls it) and
        json.loads is what the task gets."""
        sent = json.loads(json.dumps(payload))
        broker = self.sim.broker

        def send() -> None:
            broker.push(task, {"payload": sent}, origin="flip-api")

        return send
