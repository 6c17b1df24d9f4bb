"""The schema the migrations build, as text, diffed against a committed snapshot
(tests/schema/deadman.txt): a migration that changes the schema by accident fails
here, and one that changes it on purpose shows the change in review.

The snapshot is read from the catalogs (``pg_get_*def``), not from pg_dump, whose
output differs between Postgres versions in ways that say nothing about our schema.
Regenerate it after a deliberate change with
``DEADMAN_WRITE_SCHEMA_SNAPSHOT=1 .venv/bin/pytest tests/integration/test_schema_snapshot.py``
(the only way a test here writes a tracked file: when asked to).
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

SNAPSHOT = Path(__file__).resolve().parents[1] / "schema" / "deadman.txt"

CATALOG = """
SELECT 'table ' || c.relname || E'\\n' || string_agg(
         '  ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
         || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
         || COALESCE(' default ' || pg_get_expr(d.adbin, d.adrelid), ''),
         E'\\n' ORDER BY a.attnum) AS line
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
WHERE n.nspname = 'deadman' AND c.relkind IN ('r', 'v', 'p')
GROUP BY c.relname
UNION ALL
SELECT 'table options ' || c.relname || ' ' || array_to_string(c.reloptions, ',')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'deadman' AND c.reloptions IS NOT NULL
UNION ALL
SELECT 'constraint ' || r.relname || '.' || k.conname || ' ' || pg_get_constraintdef(k.oid)
FROM pg_constraint k
JOIN pg_class r ON r.oid = k.conrelid
JOIN pg_namespace n ON n.oid = r.relnamespace
WHERE n.nspname = 'deadman'
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid)
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'deadman'
UNION ALL
SELECT 'sequence ' || c.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'deadman' AND c.relkind = 'S'
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid)
FROM pg_trigger t
JOIN pg_class c ON c.oid = t.tgrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'deadman' AND NOT t.tgisinternal
UNION ALL
SELECT 'function ' || pg_get_functiondef(p.oid)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'deadman'
UNION ALL
SELECT 'view ' || c.relname || E'\\n' || pg_get_viewdef(c.oid, true)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'deadman' AND c.relkind = 'v'
UNION ALL
SELECT 'role ' || r.rolname || ' on ' || c.relname || ': '
       || string_agg(DISTINCT g.privilege_type, ',' ORDER BY g.privilege_type)
FROM information_schema.role_table_grants g
JOIN pg_roles r ON r.rolname = g.grantee
JOIN pg_class c ON c.relname = g.table_name
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = g.table_schema
WHERE g.table_schema = 'deadman' AND r.rolname LIKE 'deadman%%'
GROUP BY r.rolname, c.relname
ORDER BY 1
"""


def schema_text(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(CATALOG).fetchall()
    return "\n".join(str(r[0]).rstrip() for r in rows) + "\n"


def test_migrations_build_the_committed_schema(db_dsn: str) -> None:
    text = schema_text(db_dsn)
    if os.environ.get("DEADMAN_WRITE_SCHEMA_SNAPSHOT") == "1":
        SNAPSHOT.write_text(text, encoding="utf-8")
    assert SNAPSHOT.is_file(), f"no snapshot at {SNAPSHOT}: see this module's docstring"
    want = SNAPSHOT.read_text(encoding="utf-8")
    assert text == want, (
        "the migrated schema differs from tests/schema/deadman.txt; if the change is "
        "deliberate, regenerate it (see this module's docstring) and commit the diff"
    )
