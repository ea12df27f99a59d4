"""The domain: SQLAlchemy models and the two state machines. No Celery, boto3 or NVFLARE here."""

from models.attempts import attempt_number
from models.base import Base, utcnow
from models.callbacks import CallbackCursor, CallbackReceiver
from models.drains import ALL_NETS, Drain
from models.early_aborts import EarlyAbort
from models.early_cancels import EarlyCancel
from models.housekeeping import HousekeepingRun
from models.kicks import PendingKick
from models.metrics import MetricNetClock, MetricTotal
from models.prewarms import REFUSALS, Prewarm, PrewarmOutcome
from models.reasons import REASONS, FlipStatus, ReasonCode
from models.rejected import RefusedMessage, RejectedRequest
from models.states import (
    ACTIVE_JOB_STATES,
    ASSIGNABLE_NET_STATES,
    JOB_TRANSITIONS,
    NET_TRANSITIONS,
    TERMINAL_JOB_STATES,
    IllegalTransition,
    JobState,
    NetState,
)
from models.tables import (
    Job,
    JobEvent,
    Net,
    NetEvent,
    ScaleEvent,
    StrayRun,
)

__all__ = [
    "ACTIVE_JOB_STATES",
    "ALL_NETS",
    "ASSIGNABLE_NET_STATES",
    "JOB_TRANSITIONS",
    "NET_TRANSITIONS",
    "REASONS",
    "REFUSALS",
    "TERMINAL_JOB_STATES",
    "Base",
    "CallbackCursor",
    "CallbackReceiver",
    "Drain",
    "EarlyAbort",
    "EarlyCancel",
    "FlipStatus",
    "HousekeepingRun",
    "IllegalTransition",
    "Job",
    "JobEvent",
    "JobState",
    "MetricNetClock",
    "MetricTotal",
    "Net",
    "NetEvent",
    "NetState",
    "PendingKick",
    "Prewarm",
    "PrewarmOutcome",
    "ReasonCode",
    "RefusedMessage",
    "RejectedRequest",
    "ScaleEvent",
    "StrayRun",
    "attempt_number",
    "utcnow",
]
