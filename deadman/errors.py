"""The error hierarchy, and the one place psycopg errors become ours.

Callers catch :class:`DeadmanError` or one of its few children; they never need to
know psycopg's exception zoo. :func:`translate` is the single boundary: the store
wraps every database call in it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import errors as pgerr


class DeadmanError(Exception):
    """Root of every error Deadman raises on purpose."""


class ConfigError(DeadmanError):
    """A setting is missing or nonsense; the message names the variable."""


class LeaseLost(DeadmanError):
    """A fenced write matched no row: another worker (or the rescuer) owns the job now.

    The worker must abandon the job. Nothing it wrote in the same transaction commits.
    """


class DuplicateKey(DeadmanError):
    """An idempotency key is already taken by a job with a different request."""


class InvalidJob(DeadmanError):
    """A job's fields break a rule (bad type name, priority out of range, ...)."""


class IllegalTransition(DeadmanError):
    """A state change that the transition table does not allow."""


class NotFound(DeadmanError):
    """No such job (or queue, or workflow)."""


class Conflict(DeadmanError):
    """The job is in a state where the requested action makes no sense."""


class UnsupportedConnection(DeadmanError):
    """``conn=`` got something the client cannot join: another driver (psycopg2,
    asyncpg), a sync connection for the async client (or the reverse), a Django
    connection outside ``transaction.atomic()``, or a connection to another database
    than the client's own. The message says which, and what would work."""


class SchemaMismatch(DeadmanError):
    """The database's schema version is not the one this code was written for."""


class DatabaseUnavailable(DeadmanError):
    """Postgres could not be reached, or the pool had no connection in time.

    Transient: retrying later may succeed (HTTP turns it into 503 + Retry-After).
    """


@contextmanager
def translate() -> Iterator[None]:
    """Turn psycopg errors into Deadman errors, keeping the cause chained."""
    try:
        yield
    except DeadmanError:
        raise
    except pgerr.UniqueViolation as exc:
        raise DuplicateKey(str(exc.diag.message_detail or exc)) from exc
    except (pgerr.IntegrityError, pgerr.DataException) as exc:
        # constraint violations and bad values (class 22: out of range, NUL bytes...)
        raise InvalidJob(str(exc.diag.message_primary or exc)) from exc
    except psycopg.DataError as exc:  # refused client-side while adapting a value
        raise InvalidJob(str(exc)) from exc
    except psycopg.OperationalError as exc:
        # Class 54 (program limit exceeded: a jsonb over 256 MiB, JSON nested too
        # deep) is what psycopg calls operational, but no retry can ever succeed: a
        # writer that retried it did so for ever.
        if (exc.sqlstate or "").startswith("54"):
            raise InvalidJob(str(exc.diag.message_primary or exc)) from exc
        raise DatabaseUnavailable(str(exc)) from exc
    except (
        psycopg.InterfaceError,
        # the server ended a session left idle in its transaction (see rescuer_try_lock):
        # the connection is gone, as after any other disconnect
        pgerr.IdleInTransactionSessionTimeout,
    ) as exc:
        raise DatabaseUnavailable(str(exc)) from exc
    except Exception as exc:  # pool timeouts live outside psycopg's error tree
        if type(exc).__name__ in {"PoolTimeout", "TooManyRequests", "PoolClosed"}:
            raise DatabaseUnavailable(str(exc)) from exc
        raise
