"""What an attempt's end writes: the handler's result checked for storage, an
exception as error text, and the verdict of a failure (retry or dead)."""

from __future__ import annotations

import inspect
import json
import traceback
from typing import Any

from deadman.model import AttemptOutcome, Job, JobState
from deadman.storable import MAX_DEPTH, check_storable
from deadman.store import Finish

MAX_ERROR_CHARS = 8000


def checked_result(result: Any, max_bytes: int) -> tuple[Any, int, str | None]:
    """(the result as it will be stored, its bytes of JSON, None), or (None, 0, why
    it cannot be stored).

    The result is encoded and decoded once here, so the completer's batch only
    ever holds plain JSON values: nothing a handler returns (a tuple hiding a
    lone surrogate, an object it keeps mutating in another thread) can reach
    the batch statement and sink the other outcomes in it. Held to the limits
    of a payload: ``max_bytes`` (DEADMAN_MAX_PAYLOAD_BYTES) and MAX_DEPTH levels
    of nesting.
    """
    if result is None:
        return None, 0, None
    if inspect.isawaitable(result):
        kind = type(result).__name__
        close_awaitable(result)
        return (
            None,
            0,
            (
                f"handler result is not JSON: the handler returned a {kind} (a coroutine"
                " or other awaitable) instead of a result; register an `async def`"
                " function, or await it inside the handler"
            ),
        )
    try:
        encoded = json.dumps(result, ensure_ascii=False)
    except RecursionError:
        return (
            None,
            0,
            f"handler result cannot be stored: nested deeper than {MAX_DEPTH} levels",
        )
    except Exception as exc:
        return None, 0, f"handler result is not JSON: {safe_str(exc)}"
    size = len(encoded.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        return (
            None,
            0,
            (
                f"handler result cannot be stored: {size} bytes of JSON, over the limit of"
                f" {max_bytes} bytes (DEADMAN_MAX_PAYLOAD_BYTES)"
            ),
        )
    try:
        stored = json.loads(encoded)  # NaN comes back as NaN: check_storable names it
    except Exception as exc:
        return None, 0, f"handler result is not JSON: {safe_str(exc)}"
    problems = check_storable(stored)
    if problems:
        text = "; ".join(f"{_result_path(p['field'])}: {p['message']}" for p in problems)
        return None, 0, f"handler result cannot be stored: {text}"
    return stored, size, None


def failure(job: Job, lease_token: int, error: str, outcome: AttemptOutcome) -> Finish:
    """A failed attempt: dead after its last attempt, otherwise retrying after the
    job's backoff."""
    if job.attempt >= job.max_attempts:
        return Finish(job.id, lease_token, JobState.DEAD, outcome, error=error)
    delay = job.backoff.delay_ms(job.attempt)
    return Finish(job.id, lease_token, JobState.RETRYING, outcome, delay_ms=delay, error=error)


def describe(exc: BaseException) -> str:
    """An exception as the attempt's error: its traceback, the middle cut out past
    MAX_ERROR_CHARS."""
    text = "".join(traceback.format_exception(exc))
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS // 2] + "\n...\n" + text[-MAX_ERROR_CHARS // 2 :]
    return text


def safe_repr(value: object) -> str:
    """repr() for log lines and error texts; never raises (a handler's exception may
    define a __repr__ that does)."""
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__} object, repr() failed>"


def safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"{type(exc).__name__} (str() failed)"


def close_awaitable(value: Any) -> None:
    """Close a coroutine nobody will await (no 'never awaited' warning later)."""
    if inspect.iscoroutine(value):
        value.close()


def _result_path(field: str) -> str:
    """check_storable's path (made for a request body) as a path into the result."""
    if field == "body":
        return "result"
    return f"result{field}" if field.startswith("[") else f"result.{field}"
