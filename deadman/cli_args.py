"""The argument types of the ``deadman`` command: bounded numbers, queue names, job
ids, states and filters, each refusing a bad value with a short message."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from deadman.errors import InvalidJob
from deadman.model import QUEUE_RE, JobState

#: Ids are bigints; a larger number is a typo to report, not a query to send.
MAX_ID = 2**63 - 1


def integer(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an ASCII integer from ``low`` to ``high`` (``int()`` would also
    take '١٢' and 4,000-digit numbers)."""

    def parse(value: str) -> int:
        text = value.strip()
        digits = text[1:] if text[:1] in "+-" else text
        if not (digits.isascii() and digits.isdigit()) or len(digits) > 19:
            raise argparse.ArgumentTypeError(f"{shown(value)} is not an integer")
        n = int(text)
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got {n}")
        return n

    return parse


def number(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite decimal number from ``low`` to ``high``."""

    def parse(value: str) -> float:
        try:
            x = float(value) if value.isascii() else math.nan
        except ValueError:
            x = math.nan
        if not math.isfinite(x):
            raise argparse.ArgumentTypeError(f"{shown(value)} is not a finite number")
        if not low <= x <= high:
            raise argparse.ArgumentTypeError(f"must be from {low:g} to {high:g}, got {x:g}")
        return x

    return parse


def queue_names(value: str) -> tuple[str, ...]:
    """--queues a,b: at least one name, each a valid queue name."""
    names = tuple(q.strip() for q in value.split(",") if q.strip())
    if not names:
        raise argparse.ArgumentTypeError("name at least one queue")
    for name in names:
        if not QUEUE_RE.fullmatch(name):
            raise argparse.ArgumentTypeError(
                f"{shown(name)}: queue names are 1-128 characters of [A-Za-z0-9_.:-]"
            )
    return names


def job_id(value: str) -> int:
    # isdigit() alone is true for '²', which int() refuses, and int() takes '١٢'
    if not (value.isascii() and value.isdigit()) or len(value) > 19:
        raise argparse.ArgumentTypeError(f"job id must be a positive integer, not {shown(value)}")
    n = int(value)
    if not 1 <= n <= MAX_ID:
        raise argparse.ArgumentTypeError(f"job id must be from 1 to {MAX_ID}")
    return n


def page_limit(value: str) -> int:
    if not (value.isascii() and value.isdigit() and len(value) <= 4 and 1 <= int(value) <= 1000):
        raise argparse.ArgumentTypeError("limit must be an integer from 1 to 1000")
    return int(value)


def interval(value: str) -> float:
    try:
        seconds = float(value) if value.isascii() else math.nan
    except ValueError:
        seconds = math.nan
    if not 0.1 <= seconds <= 3600:  # also false for nan
        raise argparse.ArgumentTypeError("interval must be 0.1 to 3600 seconds")
    return seconds


def job_state(value: str) -> JobState:
    try:
        return JobState(value)
    except ValueError:
        names = ", ".join(s.value for s in JobState)
        raise argparse.ArgumentTypeError(f"state must be one of {names}") from None


def validated(check: Callable[[str], str]) -> Callable[[str], str]:
    """An argparse type from a model check (validate_type, validate_queue)."""

    def parse(value: str) -> str:
        try:
            return check(value)
        except InvalidJob as exc:  # the message quotes the value: keep it short
            message = str(exc)
            raise argparse.ArgumentTypeError(
                message if len(message) <= 200 else f"{shown(value)}: {message[-60:]}"
            ) from None

    return parse


def shown(value: str, width: int = 40) -> str:
    """A value as an error message may quote it: escaped and cut short."""
    return repr(value if len(value) <= width else value[:width] + "...")


def integer_text(text: str) -> int:
    """An ASCII integer of any size the spec may then refuse (argparse's int() would
    take other scripts' digits and 5,000-digit numbers)."""
    digits = text[1:] if text[:1] in "+-" else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 20:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an integer")
    return int(text)
