-- Workflows (dependency DAGs) and deadlines.
--
-- A workflow is a set of jobs (its nodes) and edges between them (deadman.job_deps).
-- A job with unfinished dependencies is 'waiting' and counts them in pending_deps;
-- when a dependency succeeds, each direct dependent's counter drops by one and the
-- dependents that reach 0 become due. When a dependency ends dead or cancelled, its
-- waiting dependents are cancelled, transitively. Both happen in the transaction
-- that ended the dependency, by the trigger below, so they are as durable as the
-- completion itself and cost O(out-degree) per finished job: no scan of the workflow.

CREATE TABLE deadman.workflows (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text        NOT NULL,
    state        text        NOT NULL DEFAULT 'running',
    -- Counters kept by the trigger, in the transaction that ends (or reopens) a node.
    -- The workflow row is updated by every node that finishes, so concurrent
    -- finishers serialise on its row lock and each recomputes from the committed
    -- counts: exactly one of them brings `unfinished` to 0 and finalises.
    nodes        integer     NOT NULL,
    unfinished   integer     NOT NULL,
    failed       integer     NOT NULL DEFAULT 0,
    cancelled    integer     NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    CONSTRAINT workflows_name_valid CHECK (length(name) BETWEEN 1 AND 128),
    CONSTRAINT workflows_state_valid
        CHECK (state IN ('running', 'succeeded', 'failed', 'cancelled')),
    CONSTRAINT workflows_counts_valid
        CHECK (unfinished BETWEEN 0 AND nodes AND failed >= 0 AND cancelled >= 0),
    CONSTRAINT workflows_finished_iff_done
        CHECK ((state = 'running') = (finished_at IS NULL))
);

ALTER TABLE deadman.jobs
    ADD COLUMN workflow_id           bigint REFERENCES deadman.workflows (id),
    ADD COLUMN node                  text,
    -- dependencies not yet succeeded; 'waiting' jobs only
    ADD COLUMN pending_deps          integer NOT NULL DEFAULT 0,
    -- set on a job once anything depends on it: the trigger's cheap filter
    ADD COLUMN has_dependents        boolean NOT NULL DEFAULT false,
    -- schedule-to-start: not started by then, the job ends dead ('expired')
    ADD COLUMN start_by              timestamptz,
    -- total, across retries: no attempt starts after it ('deadline')
    ADD COLUMN deadline              timestamptz,
    -- a handler that calls ctx.heartbeat() and then stops for this long is hung
    ADD COLUMN heartbeat_timeout_ms  integer,
    ADD CONSTRAINT jobs_pending_deps_nonnegative CHECK (pending_deps >= 0),
    ADD CONSTRAINT jobs_heartbeat_timeout_positive
        CHECK (heartbeat_timeout_ms IS NULL OR heartbeat_timeout_ms > 0),
    ADD CONSTRAINT jobs_node_iff_workflow CHECK ((workflow_id IS NULL) = (node IS NULL));

-- Both directions of an edge: "what do I wait for" (primary key) and "who waits for
-- me" (the release on completion, and the ON DELETE CASCADE of retention pruning).
CREATE TABLE deadman.job_deps (
    job_id      bigint NOT NULL REFERENCES deadman.jobs (id) ON DELETE CASCADE,
    depends_on  bigint NOT NULL REFERENCES deadman.jobs (id) ON DELETE CASCADE,
    PRIMARY KEY (job_id, depends_on),
    CONSTRAINT job_deps_no_self CHECK (job_id <> depends_on)
);
CREATE INDEX job_deps_depends_on_idx ON deadman.job_deps (depends_on, job_id);

-- A workflow's nodes, for GET /workflows/{id} and POST /workflows/{id}/cancel.
CREATE UNIQUE INDEX jobs_workflow_node_uq ON deadman.jobs (workflow_id, node)
    WHERE workflow_id IS NOT NULL;

-- The rescuer's expiry of start_by and deadline: only jobs that carry one and have
-- not started (a small set), so each tick is a short index range scan.
CREATE INDEX jobs_start_by_idx ON deadman.jobs (start_by)
    WHERE start_by IS NOT NULL AND state IN ('waiting', 'scheduled', 'queued', 'retrying');
CREATE INDEX jobs_deadline_idx ON deadman.jobs (deadline)
    WHERE deadline IS NOT NULL AND state IN ('waiting', 'scheduled', 'queued', 'retrying');

-- Why a trigger and not CTEs in job_finish_many: every path that ends a job must
-- release or cancel its dependents and count it in its workflow (the completer,
-- ctx.transaction(), the rescuer's dead and cancelled verdicts, POST /jobs/{id}/cancel,
-- deadline expiry, workflow cancel). And a dependency added by a concurrent
-- `depends_on` insert must not be missed: that insert locks the dependency row
-- (UPDATE ... SET has_dependents), so a completion either ran first (the insert
-- then sees it succeeded) or waits for the insert's commit; the trigger's statements
-- then take a fresh READ COMMITTED snapshot and see the new job_deps rows, which a
-- CTE of the completion's own statement (older snapshot) would not.
-- The trigger fires only for rows that have dependents or belong to a workflow
-- (WHEN clause, evaluated without calling the function), so plain jobs pay nothing.
CREATE FUNCTION deadman.job_state_changed() RETURNS trigger
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
                finished_at = now(),
                last_error = format('upstream %s %s',
                                    COALESCE(NEW.node, 'job ' || NEW.id), NEW.state)
            FROM (SELECT w.id FROM deadman.jobs w JOIN down ON w.id = down.id
                  WHERE w.state = 'waiting' ORDER BY w.id FOR UPDATE OF w) AS c
            WHERE j.id = c.id AND j.state = 'waiting';
        END IF;
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

CREATE TRIGGER jobs_state_changed
    AFTER UPDATE OF state ON deadman.jobs
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
          AND (NEW.has_dependents OR NEW.workflow_id IS NOT NULL))
    EXECUTE FUNCTION deadman.job_state_changed();

-- The API role: create workflows and their edges, read them.
GRANT SELECT, INSERT, UPDATE ON deadman.workflows TO deadman_api;
GRANT SELECT, INSERT ON deadman.job_deps TO deadman_api;
GRANT USAGE, SELECT ON SEQUENCE deadman.workflows_id_seq TO deadman_api;
