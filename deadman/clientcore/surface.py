"""The clients' surface, listed once: every call both ``deadman.Client`` and
``deadman.AsyncClient`` have, as an :class:`~deadman.clientcore.core.Op` of the
function that writes it (``jobs``, ``admin``). A call added here is on both."""

from __future__ import annotations

from deadman.clientcore import admin, jobs
from deadman.clientcore.core import Core, Op


class Operations(Core):
    """The calls; each client adds how it runs them (``_run``) and its pool."""

    # jobs and workflows
    enqueue = Op(jobs.enqueue)
    submit = Op(jobs.submit)
    enqueue_many = Op(jobs.enqueue_many)
    workflow = Op(jobs.workflow)
    get = Op(jobs.get)
    get_workflow = Op(jobs.get_workflow)
    cancel = Op(jobs.cancel)
    retry = Op(jobs.retry)
    # flow control
    set_limit = Op(admin.set_limit)
    limits = Op(admin.LIMITS.all, "Every limit and its live state (running, available), by key.")
    limit = Op(admin.LIMITS.get, "``key``'s limit and its live state, or None.")
    delete_limit = Op(
        admin.LIMITS.delete,
        "Remove ``key``'s limit; False if it had none (its jobs run unlimited).",
    )
    # schedules
    set_schedule = Op(admin.set_schedule)
    schedules = Op(admin.SCHEDULES.all, "Every schedule, by name.")
    schedule = Op(admin.SCHEDULES.get, "The schedule ``name``, or None.")
    delete_schedule = Op(
        admin.SCHEDULES.delete, "Remove the schedule; False if there was none (its jobs stay)."
    )
    pause_schedule = Op(admin.pause_schedule)
    resume_schedule = Op(admin.resume_schedule)
