-- What the jobs table's CHECK constraints cost an UPDATE (DECISIONS 68's "not adopted").
-- Postgres evaluates every CHECK of a table on every UPDATE of a row, whichever columns
-- change, so the single-column checks (the three regexes on queue, type and limit_key,
-- the length and range checks) run again at each claim, heartbeat and finish.
-- Two scratch copies of deadman.jobs, one with every CHECK and one without the
-- single-column ones (which a DOMAIN would check only where the column is assigned),
-- no indexes on either; the same inserts and lifecycle UPDATEs on each, \timing on.
--   psql "$DEADMAN_DATABASE_URL" -f bench/check_cost.sql
-- Leaves nothing behind (the scratch schema is dropped at the end).
\timing on
DROP SCHEMA IF EXISTS deadman_check_cost CASCADE;
CREATE SCHEMA deadman_check_cost;
CREATE TABLE deadman_check_cost.all_checks
    (LIKE deadman.jobs INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
CREATE TABLE deadman_check_cost.row_checks
    (LIKE deadman.jobs INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE deadman_check_cost.row_checks
    DROP CONSTRAINT jobs_queue_valid, DROP CONSTRAINT jobs_type_valid,
    DROP CONSTRAINT jobs_limit_key_valid, DROP CONSTRAINT jobs_idempotency_key_length,
    DROP CONSTRAINT jobs_priority_range, DROP CONSTRAINT jobs_max_attempts_range,
    DROP CONSTRAINT jobs_timeout_positive, DROP CONSTRAINT jobs_heartbeat_timeout_positive,
    DROP CONSTRAINT jobs_rescues_nonnegative, DROP CONSTRAINT jobs_pending_deps_nonnegative;
\echo insert 300000: all checks, then row checks only
INSERT INTO deadman_check_cost.all_checks (id, type, queue)
SELECT g, 'bench.noop', 'default' FROM generate_series(1, 300000) g;
INSERT INTO deadman_check_cost.row_checks (id, type, queue)
SELECT g, 'bench.noop', 'default' FROM generate_series(1, 300000) g;
VACUUM ANALYZE deadman_check_cost.all_checks;
VACUUM ANALYZE deadman_check_cost.row_checks;
\echo claim 300000 (queued to running): all checks, then row checks only
UPDATE deadman_check_cost.all_checks SET state = 'running', attempt = attempt + 1,
    lease_token = id, lease_worker = 'w1', lease_expires_at = now() + interval '30 s',
    started_at = now();
UPDATE deadman_check_cost.row_checks SET state = 'running', attempt = attempt + 1,
    lease_token = id, lease_worker = 'w1', lease_expires_at = now() + interval '30 s',
    started_at = now();
VACUUM deadman_check_cost.all_checks;
VACUUM deadman_check_cost.row_checks;
\echo finish 300000 (running to succeeded): all checks, then row checks only
UPDATE deadman_check_cost.all_checks SET state = 'succeeded', finished_at = now(),
    lease_token = NULL, lease_worker = NULL, lease_expires_at = NULL;
UPDATE deadman_check_cost.row_checks SET state = 'succeeded', finished_at = now(),
    lease_token = NULL, lease_worker = NULL, lease_expires_at = NULL;
-- Per statement (DECISIONS 70): Postgres also reads and plans every CHECK of the table
-- afresh at each statement that writes a row (ExecRelCheck: the stored expression is
-- parsed and planned once per statement, then run per row), so a statement that
-- writes one row (a single enqueue, a claim or finish of one job, a heartbeat) pays
-- the whole set each time. 20,000 one-row UPDATEs by primary key (20,000 rows, each
-- once a round) in a PL/pgSQL loop, each its own statement, three rounds alternating;
-- NOTICE: microseconds a statement.
\echo one-row UPDATE statements: all checks, row checks only, no checks
CREATE TABLE deadman_check_cost.no_checks (LIKE deadman.jobs INCLUDING DEFAULTS);
INSERT INTO deadman_check_cost.no_checks SELECT * FROM deadman_check_cost.all_checks;
ALTER TABLE deadman_check_cost.all_checks ADD PRIMARY KEY (id);
ALTER TABLE deadman_check_cost.row_checks ADD PRIMARY KEY (id);
ALTER TABLE deadman_check_cost.no_checks ADD PRIMARY KEY (id);
VACUUM ANALYZE deadman_check_cost.all_checks, deadman_check_cost.row_checks,
    deadman_check_cost.no_checks;
DO $$
DECLARE
    t0 timestamptz;
    round int;
    t int;
    i int;
    n constant int := 20000;
    names constant text[] := ARRAY['all checks', 'row checks only', 'no checks'];
BEGIN
    FOR round IN 1..3 LOOP
        FOR t IN 1..3 LOOP
            t0 := clock_timestamp();
            FOR i IN 1..n LOOP  -- static statements: each planned once, as a worker's
                IF t = 1 THEN
                    UPDATE deadman_check_cost.all_checks SET priority = priority WHERE id = i;
                ELSIF t = 2 THEN
                    UPDATE deadman_check_cost.row_checks SET priority = priority WHERE id = i;
                ELSE
                    UPDATE deadman_check_cost.no_checks SET priority = priority WHERE id = i;
                END IF;
            END LOOP;
            RAISE NOTICE 'round %: % % us', round, names[t],
                round(extract(epoch FROM clock_timestamp() - t0) * 1e6 / n, 1);
        END LOOP;
    END LOOP;
END
$$;
DROP SCHEMA deadman_check_cost CASCADE;
