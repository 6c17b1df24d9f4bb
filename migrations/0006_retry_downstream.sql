-- Retrying inside a dependency graph, and idempotent workflow creation.
--
-- 1. A job cancelled because an upstream ended dead or cancelled is marked
--    upstream_cancelled. Retrying a dead or cancelled job (POST /jobs/{id}/retry,
--    `deadman dlq replay`) reopens the jobs downstream of it that were cancelled for
--    that reason: they go back to 'waiting', with pending_deps recounted from their
--    dependencies' current states, and run when those succeed. A downstream job that
--    still has another dead or cancelled dependency stays cancelled (and so does
--    everything below it): it would otherwise wait forever. Retrying that other
--    dependency reopens it later.
-- 2. POST /workflows accepts an Idempotency-Key, stored on the workflow row with a
--    fingerprint of the request, as for jobs.

ALTER TABLE deadman.jobs
    ADD COLUMN upstream_cancelled boolean NOT NULL DEFAULT false;

-- Jobs already cancelled by the 0005 trigger carry its reason text.
UPDATE deadman.jobs SET upstream_cancelled = true
WHERE state = 'cancelled' AND last_error LIKE 'upstream %';

ALTER TABLE deadman.workflows
    ADD COLUMN idempotency_key text,
    ADD COLUMN request_hash    text,
    ADD CONSTRAINT workflows_idempotency_key_valid
        CHECK (idempotency_key IS NULL OR length(idempotency_key) BETWEEN 1 AND 255),
    ADD CONSTRAINT workflows_key_has_hash
        CHECK ((idempotency_key IS NULL) = (request_hash IS NULL));
CREATE UNIQUE INDEX workflows_idempotency_key_uq ON deadman.workflows (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The jobs below `root` (which was just retried) to reopen: cancelled by an upstream,
-- reachable from root through such jobs only, and without another dead or cancelled
-- dependency above them (`blocked`, with everything below a blocked job).
CREATE FUNCTION deadman.reopen_candidates(root bigint) RETURNS bigint[]
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE down(id) AS (
        SELECT d.job_id FROM deadman.job_deps d
        JOIN deadman.jobs j ON j.id = d.job_id
        WHERE d.depends_on = root AND j.state = 'cancelled' AND j.upstream_cancelled
        UNION
        SELECT d.job_id FROM deadman.job_deps d
        JOIN down ON d.depends_on = down.id
        JOIN deadman.jobs j ON j.id = d.job_id
        WHERE j.state = 'cancelled' AND j.upstream_cancelled
    ), blocked(id) AS (
        SELECT dn.id FROM down dn
        WHERE EXISTS (SELECT 1 FROM deadman.job_deps d
                      JOIN deadman.jobs u ON u.id = d.depends_on
                      WHERE d.job_id = dn.id AND u.state IN ('dead', 'cancelled')
                        AND u.id NOT IN (SELECT id FROM down))
        UNION
        SELECT d.job_id FROM deadman.job_deps d
        JOIN blocked b ON d.depends_on = b.id
        JOIN down dn ON dn.id = d.job_id
    )
    SELECT COALESCE(array_agg(id ORDER BY id), '{}')
    FROM (SELECT id FROM down EXCEPT SELECT id FROM blocked) AS r;
$$;

-- Reopen them. Their dependencies outside the set are locked FOR SHARE first, so a
-- dependency finishing at this moment either committed before (the recount below,
-- a new statement with a new snapshot, sees it) or waits for our commit and then
-- releases the reopened job through this trigger (it is 'waiting' by then). The set
-- is computed again after the locks and only jobs found both times are reopened.
CREATE FUNCTION deadman.reopen_downstream(root bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    first  bigint[] := deadman.reopen_candidates(root);
    second bigint[];
BEGIN
    IF cardinality(first) = 0 THEN
        RETURN;
    END IF;
    PERFORM 1 FROM deadman.jobs u
    WHERE u.id IN (SELECT d.depends_on FROM deadman.job_deps d
                   WHERE d.job_id = ANY(first))
      AND NOT u.id = ANY(first)
    ORDER BY u.id
    FOR SHARE OF u;
    second := deadman.reopen_candidates(root);
    UPDATE deadman.jobs j
    SET state = 'waiting',
        upstream_cancelled = false,
        finished_at = NULL,
        attempt = 0,
        rescues = 0,
        cancel_requested = false,
        result = NULL,
        pending_deps = (SELECT count(*) FROM deadman.job_deps d
                        JOIN deadman.jobs u ON u.id = d.depends_on
                        WHERE d.job_id = j.id AND u.state <> 'succeeded')
    WHERE j.id = ANY(first)
      AND j.id = ANY(second)
      AND j.state = 'cancelled' AND j.upstream_cancelled;
END
$$;

CREATE OR REPLACE FUNCTION deadman.job_state_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    was_done boolean := OLD.state IN ('succeeded', 'dead', 'cancelled');
    is_done  boolean := NEW.state IN ('succeeded', 'dead', 'cancelled');
BEGIN
    IF was_done = is_done THEN
        RETURN NULL;
    END IF;
    IF is_done AND NEW.has_dependents THEN
        IF NEW.state = 'succeeded' THEN
            -- Release: one counter step per direct dependent (job_deps_depends_on_idx);
            -- rows locked in id order so concurrent releases cannot deadlock on them.
            UPDATE deadman.jobs j
            SET pending_deps = j.pending_deps - 1,
                state = CASE WHEN j.pending_deps > 1 THEN 'waiting'
                             WHEN j.run_at > now() THEN 'scheduled'
                             ELSE 'queued' END
            FROM (SELECT d.job_id FROM deadman.job_deps d
                  JOIN deadman.jobs w ON w.id = d.job_id
                  WHERE d.depends_on = NEW.id AND w.state = 'waiting'
                  ORDER BY d.job_id
                  FOR UPDATE OF w) AS r
            WHERE j.id = r.job_id AND j.state = 'waiting';
            -- wake the producers of the queues that just got work
            PERFORM pg_notify('deadman_jobs', q.queue)
            FROM (SELECT DISTINCT j.queue FROM deadman.job_deps d
                  JOIN deadman.jobs j ON j.id = d.job_id
                  WHERE d.depends_on = NEW.id AND j.state = 'queued') AS q;
        ELSE
            -- Cancel every waiting job downstream, transitively, in one statement.
            -- Their own trigger calls then find no waiting dependents left.
            WITH RECURSIVE down(id) AS (
                SELECT d.job_id FROM deadman.job_deps d WHERE d.depends_on = NEW.id
                UNION
                SELECT d.job_id FROM deadman.job_deps d JOIN down ON d.depends_on = down.id
            )
            UPDATE deadman.jobs j
            SET state = 'cancelled',
                upstream_cancelled = true,
                finished_at = now(),
                last_error = format('upstream %s %s',
                                    COALESCE(NEW.node, 'job ' || NEW.id), NEW.state)
            FROM (SELECT w.id FROM deadman.jobs w JOIN down ON w.id = down.id
                  WHERE w.state = 'waiting' ORDER BY w.id FOR UPDATE OF w) AS c
            WHERE j.id = c.id AND j.state = 'waiting';
        END IF;
    ELSIF was_done AND NEW.has_dependents THEN
        PERFORM deadman.reopen_downstream(NEW.id);
    END IF;
    IF NEW.workflow_id IS NOT NULL THEN
        IF is_done THEN
            UPDATE deadman.workflows
            SET unfinished = unfinished - 1,
                failed = failed + (NEW.state = 'dead')::int,
                cancelled = cancelled + (NEW.state = 'cancelled')::int,
                state = CASE WHEN unfinished - 1 > 0 THEN 'running'
                             WHEN failed + (NEW.state = 'dead')::int > 0 THEN 'failed'
                             WHEN cancelled + (NEW.state = 'cancelled')::int > 0
                             THEN 'cancelled'
                             ELSE 'succeeded' END,
                finished_at = CASE WHEN unfinished - 1 > 0 THEN NULL ELSE now() END
            WHERE id = NEW.workflow_id;
        ELSE
            -- a node retried by hand (dead/cancelled -> queued): the workflow reopens
            UPDATE deadman.workflows
            SET unfinished = unfinished + 1,
                failed = failed - (OLD.state = 'dead')::int,
                cancelled = cancelled - (OLD.state = 'cancelled')::int,
                state = 'running',
                finished_at = NULL
            WHERE id = NEW.workflow_id;
        END IF;
    END IF;
    RETURN NULL;
END
$$;

