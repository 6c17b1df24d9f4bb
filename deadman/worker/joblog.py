"""One job's log fields (logs.JOB_FIELDS), and a logger bound to them on first use."""

from __future__ import annotations

from typing import Any

from deadman import logs
from deadman.model import Job

log = logs.get("deadman.executor")


def job_fields(job: Job, lease_token: int, worker: str) -> dict[str, Any]:
    """What every log event about one attempt carries (logs.JOB_FIELDS)."""
    return {
        "job_id": job.id,
        "type": job.type,
        "queue": job.queue,
        "attempt": job.attempt,
        "lease_token": lease_token,
        "worker": worker,
    }


class JobLog:
    """``log.bind(**job_fields(...))``, done on first use: at thousands of jobs/s most
    jobs log nothing at the default level, and binding every one cost more than
    running it."""

    __slots__ = ("_bound", "_debug", "_job", "_token", "_worker")

    def __init__(self, debug: bool, job: Job, lease_token: int, worker: str) -> None:
        self._debug = debug  # the executor asks once whether debug lines are wanted
        self._job = job
        self._token = lease_token
        self._worker = worker
        self._bound: Any = None

    def _logger(self) -> Any:
        if self._bound is None:
            self._bound = log.bind(**job_fields(self._job, self._token, self._worker))
        return self._bound

    def debug(self, event: str, **kw: Any) -> None:
        if self._debug:
            self._logger().debug(event, **kw)

    def info(self, event: str, **kw: Any) -> None:
        self._logger().info(event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._logger().warning(event, **kw)

    def error(self, event: str, **kw: Any) -> None:
        self._logger().error(event, **kw)
