"""Where the suite's Postgres runs: ``DEADMAN_TEST_BACKEND``.

- ``local`` (the default, also when unset or empty): the throwaway cluster of
  :func:`deadman.devdb.throwaway`, started from this machine's PostgreSQL binaries.
- ``testcontainers``: a container started through the ``testcontainers`` package
  (``pip install 'deadman[testcontainers]'``) from ``DEADMAN_TEST_POSTGRES_IMAGE``
  (default ``postgres:16``; any image with the official one's POSTGRES_* interface),
  with the same fast settings as the throwaway cluster. For machines with a container
  engine but no PostgreSQL; the tests that stop Postgres themselves skip (as with
  ``DEADMAN_TEST_DATABASE_URL``), since they need the suite's own cluster.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from psycopg.conninfo import make_conninfo

BACKEND_ENV = "DEADMAN_TEST_BACKEND"
IMAGE_ENV = "DEADMAN_TEST_POSTGRES_IMAGE"
BACKENDS = ("local", "testcontainers")
DEFAULT_IMAGE = "postgres:16"
USER = "postgres"
#: what devdb's throwaway cluster sets (deadman/devdb_cluster.py, fast=True)
FAST_SETTINGS = ("fsync=off", "full_page_writes=off", "max_connections=200")


class BackendError(Exception):
    """DEADMAN_TEST_BACKEND or DEADMAN_TEST_POSTGRES_IMAGE is not usable."""


def backend(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    raw = env.get(BACKEND_ENV, "").strip()
    if raw == "":
        return "local"
    if raw not in BACKENDS:
        raise BackendError(f"{BACKEND_ENV}={raw[:40]!r}: must be one of {', '.join(BACKENDS)}")
    return raw


def image(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    name = env.get(IMAGE_ENV, "").strip() or DEFAULT_IMAGE
    # A reference is [registry/]name[:tag][@digest]: printable ASCII without spaces.
    if len(name) > 255 or not name.isascii() or not name.isprintable() or " " in name:
        raise BackendError(f"{IMAGE_ENV}={name[:40]!r} is not an image reference")
    return name


@contextmanager
def postgres_container(image_name: str) -> Iterator[str]:
    """A Postgres container for the session; yields the DSN of its maintenance
    database (the role is a superuser, so it can CREATE/DROP the test databases).
    Removed on exit, whatever happened."""
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError as exc:
        raise BackendError(
            f"{BACKEND_ENV}=testcontainers needs the testcontainers package: "
            "pip install 'deadman[testcontainers]'"
        ) from exc

    password = secrets.token_hex(16)
    # Like the throwaway cluster: trust (so a role that does not exist is named as such,
    # not "password authentication failed"), and a superuser whose name is no schema of
    # ours ("$user" in search_path would drop the deadman. qualifier from catalog
    # output the schema snapshot compares).
    container = PostgresContainer(
        image_name, username=USER, password=password, dbname="postgres", driver=None
    )
    container.with_env("POSTGRES_HOST_AUTH_METHOD", "trust")
    container.with_command(["postgres", *(a for s in FAST_SETTINGS for a in ("-c", s))])
    with container:
        yield make_conninfo(
            "",
            host=container.get_container_host_ip(),
            port=int(container.get_exposed_port(5432)),
            user=USER,
            password=password,
            dbname="postgres",
        )
