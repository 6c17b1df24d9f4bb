"""The databases of a chaos run: on a private throwaway cluster (the Postgres restart
scenario needs one it controls) or ``--database-url``; migrated, and refused unless
empty."""

from __future__ import annotations

import psycopg
from psycopg import sql

from deadman import devdb
from deadman.chaos.probe import Db
from deadman.db.migrate import migrate
from deadman.errors import DeadmanError


class Databases:
    """``cluster``: the private one, once made (None with ``--database-url``)."""

    def __init__(self, database_url: str | None, keep: bool) -> None:
        self.database_url = database_url
        self.keep = keep
        self.cluster: devdb.Cluster | None = None

    def load(self) -> str:
        """The database of the load phase (the exactly-once count)."""
        if self.database_url:
            return self._migrated(self.database_url)
        # fsync off (devdb's fast mode): Postgres itself is crashed and restarted
        # here, not the OS, and a process crash loses nothing the OS has been
        # handed. synchronous_commit stays on.
        self.cluster = devdb.throwaway(prefix="deadman-chaos-")
        return self._create("chaos")

    def operators(self, alone: bool) -> str | None:
        """The operators scenario's own database (its one-second retention deletes
        the jobs the load phase's count needs). With ``--database-url`` only when it
        runs alone (that database, then); None: it cannot run."""
        if self.database_url:
            return self.load() if alone else None
        if self.cluster is None:
            self.cluster = devdb.throwaway(prefix="deadman-chaos-")
        return self._create("chaos_operators")

    def handoffs(self, alone: bool) -> str | None:
        """The handoffs scenario's own database (its jobs go in one by one, not as the
        load phase's count); as :meth:`operators`."""
        if self.database_url:
            return self.load() if alone else None
        if self.cluster is None:
            self.cluster = devdb.throwaway(prefix="deadman-chaos-")
        return self._create("chaos_handoffs")

    def destroy(self) -> None:
        """The private cluster goes away, unless ``--keep``."""
        if self.cluster is not None and not self.keep:
            self.cluster.destroy()

    def _create(self, name: str) -> str:
        assert self.cluster is not None
        with psycopg.connect(self.cluster.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self._migrated(self.cluster.dsn(name))

    def _migrated(self, dsn: str) -> str:
        migrate(dsn)
        if not Db(dsn).value("database_is_empty"):
            raise DeadmanError(
                "the database already holds jobs, effects or chaos invocations; the "
                "verifier counts whole tables, so give the chaos run a database of its own"
            )
        return dsn
