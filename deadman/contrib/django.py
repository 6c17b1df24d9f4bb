"""Enqueue inside a Django transaction: ``conn=django.db.connection`` (or
``conn=connection("replica")`` for another alias) inside ``transaction.atomic()``.

Needs Django's PostgreSQL backend on psycopg 3 (Django 4.2+ uses it when psycopg is
installed). The job is written on Django's own psycopg connection, in its current
transaction and savepoint: it commits with the ``atomic()`` block, or not at all.

Outside ``atomic()`` Django runs in autocommit, so there is no transaction to join: the
job would commit at once, on its own, which is what ``client.enqueue(...)`` without
``conn=`` already does on the client's own connection. Joining there is refused
(:class:`~deadman.errors.UnsupportedConnection`) rather than silently committing what
the caller may have meant to roll back; leave ``conn=`` out for that.
"""

from __future__ import annotations

from typing import Any

import psycopg

from deadman.connections import DjangoConnection
from deadman.errors import UnsupportedConnection


def connection(using: str = "default") -> DjangoConnection:
    """Django's connection for the database alias ``using`` (this thread's), to pass
    as ``conn=``."""
    from django.db import connections

    found: DjangoConnection = connections[using]
    return found


def psycopg_connection(django_connection: DjangoConnection) -> psycopg.Connection[Any]:
    """The psycopg connection under a Django connection, inside its atomic block."""
    wrapper = django_connection
    if wrapper.vendor != "postgresql":
        raise UnsupportedConnection(
            f"conn= is a Django connection to {wrapper.vendor}; deadman needs PostgreSQL"
        )
    if not wrapper.in_atomic_block:
        raise UnsupportedConnection(
            "conn= is a Django connection outside transaction.atomic(): there is no "
            "transaction to join (it is in autocommit); enqueue inside atomic(), or "
            "leave conn= out to commit the job at once"
        )
    # An atomic block whose statement failed: Django refuses every query until the
    # block ends, and so does deadman (Postgres would refuse it too).
    wrapper.validate_no_broken_transaction()
    wrapper.ensure_connection()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise UnsupportedConnection(
            f"conn= is a Django connection on {type(raw).__module__} (psycopg2?); deadman "
            "joins only psycopg 3 connections: install psycopg (Django 4.2+ uses it)"
        )
    return raw
