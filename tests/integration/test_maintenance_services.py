"""The maintenance services on their restartable base: each started and stopped
repeatedly (acting after every start, never after a stop), a failing tick that
does not end its service, and leadership: of two competing processes' services,
only one acts per tick (real Postgres, two stores)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from structlog.testing import capture_logs

from deadman.config import Settings
from deadman.maintenance import Cleaner, Expirer, Rescuer, RescueReport, Service
from deadman.model import Job
from deadman.store import AsyncStore, ClaimParams, HeartbeatParams
from deadman.store.maintenance import RESCUER_KEY
from deadman.worker.process import Worker
from tests.factories import async_store, attempt_rows, connect, insert_job, job_row, run_async
from tests.helpers import wait_for_async

SETTINGS = Settings(rescue_s=0.02)  # the cleaner ticks every 10 of these: 0.2 s


def _state(dsn: str, job_id: int) -> str | None:
    with connect(dsn) as conn:
        row = conn.execute("SELECT state FROM deadman.jobs WHERE id = %s", (job_id,)).fetchone()
    return None if row is None else str(row["state"])


def _lapsed(dsn: str) -> int:
    with connect(dsn) as conn:
        return insert_job(conn, state="running", lease_expires_in_s=-10).id


def _late(dsn: str) -> int:
    with connect(dsn) as conn:
        job_id = insert_job(conn, state="queued").id
        conn.execute(
            "UPDATE deadman.jobs SET start_by = now() - interval '1 second' WHERE id = %s",
            (job_id,),
        )
    return job_id


def _old(dsn: str) -> int:
    with connect(dsn) as conn:
        return insert_job(conn, state="succeeded", finished_ago_s=3 * 24 * 3600).id


def _reaches(dsn: str, job_id: int, state: str | None) -> Callable[[], bool]:
    return lambda: _state(dsn, job_id) == state


def _ticked(service: Service, more: int) -> Callable[[], bool]:
    target = service.ticks + more
    return lambda: service.ticks >= target


@dataclass(frozen=True)
class Case:
    make: Callable[[AsyncStore, Settings], Service]
    seed: Callable[[str], int]  # a job the service acts on
    done: str | None  # the job's state once it did (None: deleted)


CASES = {
    "rescuer": Case(Rescuer, _lapsed, "queued"),
    "expirer": Case(Expirer, _late, "dead"),
    "cleaner": Case(Cleaner, _old, None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_service_starts_and_stops_repeatedly(db_dsn: str, name: str) -> None:
    """Five times: after start() it acts (a job it owns changes); after stop() it
    never ticks again, checked over two ticks of a second instance; stop() twice and
    start() twice are harmless."""
    case = CASES[name]

    async def main() -> None:
        async with async_store(db_dsn) as store:
            service, probe = case.make(store, SETTINGS), case.make(store, SETTINGS)
            for _ in range(5):
                job_id = case.seed(db_dsn)
                service.start()
                service.start()  # idempotent: still one loop
                await wait_for_async(
                    _reaches(db_dsn, job_id, case.done), 10, message=f"the {name} to act"
                )
                await service.stop()
                await service.stop()  # idempotent
                assert not service.running
                ticks = service.ticks
                probe.start()
                await wait_for_async(_ticked(probe, 2), 10, message="two ticks of the probe")
                await probe.stop()
                assert service.ticks == ticks, "ticked after stop()"

    run_async(main)


def test_a_tick_that_raises_does_not_end_the_service(db_dsn: str) -> None:
    class Flaky(Service):
        name = "flaky"
        calls = 0

        async def tick(self) -> None:
            self.calls += 1
            if self.calls <= 2:
                raise RuntimeError("a bug in one tick")

    async def main() -> Flaky:
        flaky = Flaky(interval_s=0.01)
        flaky.start()
        try:
            await wait_for_async(
                lambda: flaky.calls >= 4, 10, message="ticks after the failing ones"
            )
        finally:
            await flaky.stop()
        return flaky

    with capture_logs() as logged:
        flaky = run_async(main)
    errors = [e for e in logged if e["event"] == "flaky_error"]
    assert len(errors) == 2 and "a bug in one tick" in errors[0]["error"]
    assert not flaky.running


def test_a_failing_tick_backs_off_and_recovers(db_dsn: str) -> None:
    """A real rescuer whose store fails once: it logs, then rescues on a later tick."""

    class FailsOnce(Rescuer):
        failed = False

        async def tick(self) -> RescueReport:
            if not self.failed:
                self.failed = True
                raise RuntimeError("one bad tick")
            return await super().tick()

    async def main() -> None:
        async with async_store(db_dsn) as store:
            job_id = _lapsed(db_dsn)
            rescuer = FailsOnce(store, SETTINGS)
            rescuer.start()
            try:
                await wait_for_async(
                    lambda: _state(db_dsn, job_id) == "queued", 10, message="the rescue"
                )
            finally:
                await rescuer.stop()

    with capture_logs() as logged:
        run_async(main)
    assert [e["event"] for e in logged].count("rescuer_error") == 1


# ------------------------------------------------------------------------ leadership


def test_two_rescuers_compete_and_only_one_acts_per_tick(db_dsn: str) -> None:
    """Two stores (two processes' pools), two rescuers, ticking at once, ten rounds of
    one lapsed lease each: every round exactly one leads, and every job is rescued
    exactly once. While one holds leadership the other does nothing."""

    async def main() -> None:
        async with async_store(db_dsn) as one, async_store(db_dsn) as two:
            a, b = Rescuer(one, SETTINGS), Rescuer(two, SETTINGS)
            job_id = _lapsed(db_dsn)
            async with a.leadership.lead(RESCUER_KEY) as held:
                assert held is not None
                assert await b.tick() == RescueReport(leader=False)
                assert _state(db_dsn, job_id) == "running"
            assert (await b.tick()).requeued == [job_id]
            for _ in range(10):
                job_id = _lapsed(db_dsn)
                reports = await asyncio.gather(a.tick(), b.tick())
                # overlapping: one led, the other skipped; one after the other: the
                # second led too, and found nothing left to rescue
                acted = [r.requeued for r in reports if r.requeued]
                assert acted == [[job_id]], reports
                assert any(r.leader for r in reports)
                with connect(db_dsn) as conn:
                    assert len(attempt_rows(conn, job_id)) == 1
                    assert job_row(conn, job_id)["rescues"] == 1

    run_async(main)


# ------------------------------------------------------- a Worker's store and services


def test_a_worker_runs_on_the_store_and_services_it_is_given(db_dsn: str) -> None:
    """No monkeypatching: the worker's producer and heartbeat use the store handed in,
    and the services handed in run while the worker does and stop with it."""

    class Recording(AsyncStore):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.calls: list[str] = []

        async def job_claim(self, p: ClaimParams, retry_s: float | None = None) -> list[Job]:
            self.calls.append("job_claim")
            return await super().job_claim(p, retry_s)

        async def job_heartbeat_many(
            self, p: HeartbeatParams, retry_s: float | None = None
        ) -> dict[int, bool]:
            self.calls.append("job_heartbeat_many")
            return await super().job_heartbeat_many(p, retry_s)

    class Counting(Service):
        name = "counting"

        async def tick(self) -> None:
            pass

    async def main() -> None:
        store = Recording.create(db_dsn, min_size=1, max_size=4)
        service = Counting(interval_s=0.01)
        worker = Worker(db_dsn, SETTINGS, store=store, services=[service])
        running = asyncio.create_task(worker.run())
        try:
            await wait_for_async(
                lambda: (
                    {"job_claim", "job_heartbeat_many"} <= set(store.calls) and service.ticks >= 2
                ),
                20,
                message="the worker to claim and beat through the store, and the service to tick",
            )
        finally:
            worker.request_stop()
            assert await asyncio.wait_for(running, 30) == 0
        assert not service.running  # stopped with the worker
        assert worker.services == [service]  # given services replace the default ones

    run_async(main)
