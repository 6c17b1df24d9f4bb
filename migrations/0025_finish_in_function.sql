-- ctx.transaction()'s fenced completion, planned once per session.
--
-- It ran job_finish_many on the handler's connection, which (unlike the worker's own:
-- deadman/db/plans.py) plans prepared statements in Postgres's default way, since the
-- handler's own statements run there too. For job_finish_many that default meant a
-- new plan on every call: a custom plan of a batch of one always looks cheaper than
-- the generic one, and planning a statement on deadman.jobs (its partial indexes,
-- its CHECKs) cost more server CPU than running it (DECISIONS 113). This function is
-- job_finish_many, word for word (tests/integration/test_finish_in_function.py fails
-- if the two drift apart), with the worker's plan settings in its own SET clauses:
-- they hold while it runs and are undone when it returns, so the handler's session
-- keeps its own. PL/pgSQL keeps the statement's plan for the session.
CREATE FUNCTION deadman.job_finish_in(p_batch json, p_ids bigint[], p_idle_ms integer)
RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
AS $fn$
BEGIN
    RETURN QUERY
    WITH locked AS (
        -- Lock in id order: the heartbeat locks the same worker's rows in id order too,
        -- so the two multi-row statements can never deadlock each other.
        -- The batch is one JSON array of objects (one json.dumps in the worker: a tenth
        -- of its CPU went into adapting seven parameter arrays element by element).
        SELECT j.id, i.token, i.outcome, i.delay_ms, i.error, i.result,
               CASE WHEN j.cancel_requested AND i.state <> 'succeeded' THEN 'cancelled'
                    ELSE i.state END AS state,
               j.cancel_requested AND i.state NOT IN ('succeeded', 'cancelled')
                   AS cancelled_on_request
        FROM deadman.jobs j
        JOIN json_to_recordset(p_batch::json)
             AS i(id bigint, token bigint, state text, outcome text, delay_ms bigint,
                  error text, result jsonb)
          ON i.id = j.id AND i.token = j.lease_token
        WHERE j.id = ANY(p_ids::bigint[])
        ORDER BY j.id
        FOR UPDATE OF j
    ), done AS (
        UPDATE deadman.jobs j
        SET state = l.state,
            lease_token = NULL,
            lease_expires_at = NULL,
            finished_at = CASE WHEN l.state IN ('succeeded', 'dead', 'cancelled') THEN now() END,
            run_at = CASE WHEN l.state IN ('retrying', 'queued')
                          THEN now() + l.delay_ms * interval '1 millisecond'
                          ELSE j.run_at END,
            -- a released attempt (graceful shutdown) does not use up an attempt
            attempt = CASE WHEN l.outcome = 'released' THEN j.attempt - 1 ELSE j.attempt END,
            last_error = CASE WHEN l.cancelled_on_request
                              THEN COALESCE(l.error || E'\n', '') || 'cancelled on request'
                              ELSE COALESCE(l.error, j.last_error) END,
            result = l.result,
            finished_token = CASE WHEN l.state = 'succeeded' THEN l.token END
        FROM locked l
        WHERE j.id = l.id AND j.lease_token = l.token
        RETURNING j.id, j.attempt, j.lease_worker, j.started_at, l.token, l.outcome, l.error,
                  j.finished_token
    ), history AS (
        INSERT INTO deadman.attempt_log (lease_token, job_id, attempt, worker, started_at,
                                      outcome, error)
        SELECT token, id, CASE WHEN outcome = 'released' THEN attempt + 1 ELSE attempt END,
               lease_worker, started_at, outcome, error
        FROM done
        WHERE finished_token IS NULL  -- a succeeded attempt stays in its job's row
    )
    SELECT id FROM done
    UNION ALL
    -- ctx.transaction()'s fenced completion (job_finish_in) passes p_idle_ms: from this
    -- statement on its transaction holds the job's row lock, and a worker paused or cut
    -- off before its COMMIT would keep the job out of the rescuer's reach (SKIP LOCKED
    -- passes over it) until TCP keepalive noticed, hours later by default. So the server
    -- ends the session once the transaction has sat idle for p_idle_ms ms, armed here
    -- (local to the transaction) when the statement ends: one round trip, not a
    -- set_config of its own before it (DECISIONS 105). NULL (the completer): nothing is
    -- set. This branch runs once, after the finish's rows, and returns no row.
    SELECT NULL FROM (
        SELECT set_config('idle_in_transaction_session_timeout', p_idle_ms::text, true)
        WHERE p_idle_ms::integer IS NOT NULL
    ) AS idle (value)
    WHERE idle.value IS NULL;
END
$fn$;
