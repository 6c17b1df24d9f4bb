-- The HTTP API: indexes for the job listing, and the least-privilege role the API
-- server can run as.

-- GET /jobs lists newest first (ORDER BY id DESC) with keyset pagination
-- (id < cursor), optionally filtered by state, queue or type. Each filter gets an
-- index whose trailing column is id, so a filtered page is a short backward index
-- range scan however many rows the filter skips; without a filter the primary key
-- serves. The queue index INCLUDEs state so that "queue = X AND state = Y" pages and
-- the per-queue counts of GET /queues, /stats and /metrics can be answered from the
-- index alone (index-only scans) instead of reading the wide job rows.
-- state is already an indexed column (the partial indexes' predicates name it), so
-- these add no loss of HOT updates; the lease renewals touch none of them.
CREATE INDEX IF NOT EXISTS jobs_list_state_idx ON deadman.jobs (state, id);
CREATE INDEX IF NOT EXISTS jobs_list_queue_idx ON deadman.jobs (queue, id) INCLUDE (state);
CREATE INDEX IF NOT EXISTS jobs_list_type_idx ON deadman.jobs (type, id);

-- deadman_api: what the API server needs and nothing more. It reads and writes jobs
-- (submit, cancel, retry) but never deletes them (retention is the rescuer's job)
-- and owns no object, so it cannot DROP or ALTER anything. Roles are cluster-wide:
-- the role may already exist because another database on this cluster was migrated
-- first (or two migrations race), so it is created only when missing. NOLOGIN: a
-- login role is granted membership (GRANT deadman_api TO app_login) and the server
-- connects as that login; see the README.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'deadman_api') THEN
        CREATE ROLE deadman_api NOLOGIN;
    END IF;
EXCEPTION
    -- a concurrent migration on another database of this cluster created it first
    WHEN duplicate_object OR unique_violation THEN NULL;
END
$$;

GRANT USAGE ON SCHEMA deadman TO deadman_api;
-- jobs: submit (INSERT), cancel/retry (UPDATE), everything else reads.
GRANT SELECT, INSERT, UPDATE ON deadman.jobs TO deadman_api;
-- queues: pause/resume upsert the settings row.
GRANT SELECT, INSERT, UPDATE ON deadman.queues TO deadman_api;
-- read-only views for the API: attempt history, live workers, schema version (/ready).
GRANT SELECT ON deadman.attempts, deadman.workers, deadman.schema_migrations TO deadman_api;
-- the jobs id identity sequence (INSERT draws from it); not lease_token_seq: only a
-- worker's claim may mint fencing tokens.
GRANT USAGE, SELECT ON SEQUENCE deadman.jobs_id_seq TO deadman_api;
