"""The connection types the store takes."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import DictRow

AsyncConn = psycopg.AsyncConnection[DictRow]
SyncConn = psycopg.Connection[Any]
