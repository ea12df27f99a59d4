"""What the pipeline needs from a net's federated-learning server, whatever its backend.

A proposal (issue 38): the use cases call these operations today through
`app.adapters.nvflare.base.AdminClient`, which is this very Protocol under its NVFLARE name.
Two implementations satisfy it, checked by mypy below:

- NVFLARE: `app.adapters.nvflare.client.NvflareAdminClient` (admin sessions, 2.9);
- Flower: `app.adapters.flower.client.FlowerControlClient` (a SuperLink's Control API, 1.42).

Both answer in the same types (`ServerState`, `Readiness`, `RunStatus`, `AbortResult`) and
raise the same error classes of `app.errors`: `ServerUnavailable` (down or starting: retry),
`AdminMisconfigured` (fatal until a human fixes the net), `NvflareJobNotFound` (the server has
no such run), `NvflareJobNotRunning`, `InvalidRequest` (the job's app or its folder is wrong),
`UnknownAdminError` (nobody classified it: retried, logged, counted). Wiring a net's backend
choice in `runtime._build_admin` and renaming the NVFLARE-worded names (`nvflare_job_id`,
`NvflareJobNotFound`) is left to the change that makes the backend a net's setting.

Where the backends differ, behind the same words:

- `server_start_time`: NVFLARE's server process start time; Flower's SuperLink tells none, so
  its client answers a constant (`flower.client.NO_START_TIME`) and a restart under a run
  shows in the run's own record instead (forgotten, or finished without a verdict: LOST).
- `submit`'s token: NVFLARE resolves it itself; the Flower client puts it in the run config
  and looks for it before starting a run.
- `abort`: Flower's stop is final, so it never answers ABORTED_BEFORE_START or NOT_RUNNING.
- Sites: NVFLARE's client names; Flower's SuperNodes by their registered names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.adapters.nvflare.base import AdminClient

# The interface, under the name it will carry once nothing in it is NVFLARE's alone.
BackendClient = AdminClient

if TYPE_CHECKING:
    from app.adapters.flower.client import FlowerControlClient
    from app.adapters.nvflare.client import NvflareAdminClient

    def _both_conform(
        nvflare: NvflareAdminClient, flower: FlowerControlClient
    ) -> tuple[BackendClient, BackendClient]:
        """mypy fails here if either client stops satisfying the interface."""
        return nvflare, flower
