"""HandlerThreads: the threads sync handlers run in (deadman/worker/threads.py).

What the executor relies on, as it relied on ``run_in_executor`` over a thread pool:
each job's future gets its return or its exception, whatever it is; a job cancelled
before a thread took it never runs; there are never more threads than the limit, and
a thread is kept for the next job; after ``shutdown`` queued jobs are cancelled,
running ones finish, and nothing more is taken."""

from __future__ import annotations

import asyncio
import threading

import pytest

from deadman.worker.threads import HandlerThreads

WAIT_S = 10.0


def _thread(name: str) -> threading.Thread:
    (found,) = [t for t in threading.enumerate() if t.name == name]
    return found


async def _outcome(fut: asyncio.Future[object]) -> object:
    try:
        return await asyncio.wait_for(asyncio.shield(fut), WAIT_S)
    except BaseException as exc:  # the test looks at what the handler raised
        return exc


def test_every_return_and_every_exception_reaches_its_future() -> None:
    async def main() -> None:
        threads = HandlerThreads(4)

        def raising(exc: BaseException) -> None:
            raise exc

        futs = [threads.submit(lambda i=i: i * 2) for i in range(50)]
        futs.append(threads.submit(raising, ValueError("bad")))
        futs.append(threads.submit(raising, SystemExit(3)))
        futs.append(threads.submit(raising, KeyboardInterrupt()))
        futs.append(threads.submit(raising, StopIteration(7)))
        got = [await _outcome(f) for f in futs]
        assert got[:50] == [i * 2 for i in range(50)]
        assert isinstance(got[50], ValueError) and str(got[50]) == "bad"
        assert isinstance(got[51], SystemExit) and got[51].code == 3
        assert isinstance(got[52], KeyboardInterrupt)
        # a future cannot hold a StopIteration: it says what the handler raised
        assert isinstance(got[53], RuntimeError) and isinstance(got[53].__cause__, StopIteration)
        assert 1 <= threads.threads <= 4
        threads.shutdown()

    asyncio.run(main())


def test_a_job_cancelled_before_a_thread_took_it_never_runs() -> None:
    async def main() -> None:
        threads = HandlerThreads(1)
        release = threading.Event()
        ran: list[str] = []

        def note(name: str) -> None:
            if name == "first":
                release.wait(WAIT_S)
            ran.append(name)

        first = threads.submit(note, "first")
        second = threads.submit(note, "second")
        second.cancel()
        third = threads.submit(note, "third")
        release.set()
        await asyncio.wait_for(third, WAIT_S)
        assert first.done() and second.cancelled()
        assert ran == ["first", "third"]
        threads.shutdown()

    asyncio.run(main())


def test_threads_are_made_up_to_the_limit_and_kept() -> None:
    async def main() -> None:
        threads = HandlerThreads(3, name="kept")
        release = threading.Event()
        started = threading.Semaphore(0)

        def blocking() -> str:
            started.release()
            release.wait(WAIT_S)
            return threading.current_thread().name

        busy = [threads.submit(blocking) for _ in range(5)]
        for _ in range(3):  # three start; the other two wait for a thread
            assert await asyncio.to_thread(started.acquire, True, WAIT_S)
        assert threads.threads == 3
        assert not await asyncio.to_thread(started.acquire, True, 0.2)  # none is a fourth
        release.set()
        names = set(await asyncio.gather(*busy))
        assert len(names) == 3 and all(n.startswith("kept_") for n in names)
        # done and idle: the next jobs reuse them
        again = await asyncio.gather(*(threads.submit(blocking) for _ in range(3)))
        assert set(again) <= names and threads.threads == 3
        threads.shutdown()

    asyncio.run(main())


def test_shutdown_cancels_what_is_queued_lets_the_running_finish_and_takes_no_more() -> None:
    async def main() -> None:
        threads = HandlerThreads(1, name="shutdown")
        started, release = threading.Event(), threading.Event()

        def run() -> str:
            started.set()
            release.wait(WAIT_S)
            return "finished"

        running = threads.submit(run)
        queued = threads.submit(lambda: "never")
        assert await asyncio.to_thread(started.wait, WAIT_S)  # a thread took the first
        thread = _thread("shutdown_0")
        threads.shutdown()
        assert queued.cancelled()
        with pytest.raises(RuntimeError, match="after shutdown"):
            threads.submit(lambda: None)
        release.set()
        assert await asyncio.wait_for(running, WAIT_S) == "finished"
        await asyncio.to_thread(thread.join, WAIT_S)
        assert not thread.is_alive(), "the thread ended after its job"
        assert thread.daemon

    asyncio.run(main())


def test_a_job_that_returns_after_its_loop_closed_is_dropped_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    release = threading.Event()
    threads = HandlerThreads(1, name="late")
    returned = threading.Event()

    def late() -> None:
        release.wait(WAIT_S)
        returned.set()

    async def main() -> None:
        threads.submit(late)

    asyncio.run(main())  # the loop closes with the job still running
    thread = _thread("late_0")
    release.set()
    assert returned.wait(WAIT_S)
    threads.shutdown()  # off the loop: nothing queued to cancel; the thread ends
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert raised == [], "the thread's wake-up of a closed loop raised"


def test_it_serves_one_loop() -> None:
    threads = HandlerThreads(1)

    async def submit() -> None:
        await threads.submit(lambda: None)

    asyncio.run(submit())
    with pytest.raises(RuntimeError, match="one event loop"):
        asyncio.run(submit())
    threads.shutdown()
    with pytest.raises(ValueError):
        HandlerThreads(0)
