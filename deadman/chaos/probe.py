"""The harness's questions to the database while a run goes on: named queries of
``ops.sql``, each on a short-lived connection of its own."""

from __future__ import annotations

from typing import Any, LiteralString

import psycopg
from psycopg.rows import dict_row

from deadman.chaos.app import OPS


class Db:
    """The harness's window on the database: one short-lived connection per question,
    so that a restart or a terminated backend costs one missed sample, not the run."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def row(
        self, name: LiteralString, params: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        try:
            with psycopg.connect(
                self.dsn, autocommit=True, row_factory=dict_row, connect_timeout=5
            ) as conn:
                row = conn.execute(OPS[name], params or {}).fetchone()
                return dict(row) if row is not None else None
        except psycopg.OperationalError:
            return None

    def rows(
        self, name: LiteralString, params: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        try:
            with psycopg.connect(
                self.dsn, autocommit=True, row_factory=dict_row, connect_timeout=5
            ) as conn:
                return [dict(r) for r in conn.execute(OPS[name], params or {}).fetchall()]
        except psycopg.OperationalError:
            return []

    def value(self, name: LiteralString, params: dict[str, Any] | None = None) -> Any:
        row = self.row(name, params)
        return None if row is None else next(iter(row.values()))
