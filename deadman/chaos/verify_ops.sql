-- The operators scenario's verifier: plain SQL over the database after the fleet
-- drained, plus chaos.acks (every operator action the harness saw acknowledged) and
-- chaos.pruned_* (every row retention deleted, as it was when deleted), both in the
-- scenario's own database (deadman chaos --keep leaves it for psql). Parameters: the
-- job key prefix and how many jobs were acknowledged, the same for workflows, e.g.
-- 'chaos-ops-1-', 10000, 'chaos-ops-1-wf-', 250. The view_* statements make views
-- over chaos.acks when the journal is loaded; the queries read them like tables.
-- Times are the database clock: an ack's db_lo and db_hi were read just before the
-- request and just after its answer, so db_lo <= the action's commit <= db_hi.
-- A claim's started_at (the claim transaction's now()) comes before its snapshot,
-- but by how much nobody knows (a backend descheduled on a loaded machine: a run
-- caught one claiming 0.4 ms "before" a resume it had seen), so started_at > db_hi
-- proves "claimed after", while "claimed before" is proved by the lease token: the
-- claim draws it after its snapshot, and an ack's token_lo is the token sequence's
-- last value read just before the request, so lease_token <= token_lo means the
-- claim saw the database as it was before that request was even sent.

-- name: ops_submissions
-- Every acknowledged submission is a job, or was deleted by retention.
WITH every AS (
    SELECT id, idempotency_key FROM deadman.jobs
    UNION ALL
    SELECT id, idempotency_key FROM chaos.pruned_jobs
)
SELECT (SELECT count(*) FROM every) AS jobs,
       (SELECT count(*) FROM chaos.pruned_jobs) AS pruned,
       (SELECT count(*) FROM generate_series(0, %(acked)s::bigint - 1) AS n
        WHERE NOT EXISTS (SELECT 1 FROM every e
                          WHERE e.idempotency_key = %(prefix)s || n)) AS missing,
       -- a key is free again once its job was pruned, so a resend after that makes a
       -- second job: counted for the report, not a failure
       (SELECT count(*) - count(DISTINCT idempotency_key) FROM every
        WHERE idempotency_key IS NOT NULL) AS keys_reused,
       (SELECT count(*) FROM generate_series(0, %(wf_acked)s::bigint - 1) AS n
        WHERE NOT EXISTS (SELECT 1 FROM deadman.workflows w
                          WHERE w.idempotency_key = %(wf_prefix)s || n)
          AND NOT EXISTS (SELECT 1 FROM chaos.pruned_workflows w
                          WHERE w.idempotency_key = %(wf_prefix)s || n)) AS workflows_missing;

-- name: ops_retention
-- Retention only ever deletes finished jobs and finished workflows.
SELECT count(*) FILTER (WHERE state NOT IN ('succeeded', 'dead', 'cancelled'))
           AS jobs_deleted_unfinished,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded_deleted,
       count(*) FILTER (WHERE state IN ('dead', 'cancelled')) AS failed_deleted,
       (SELECT count(*) FROM chaos.pruned_workflows WHERE state = 'running')
           AS workflows_deleted_running,
       (SELECT count(*) FROM chaos.pruned_workflows) AS workflows_deleted
FROM chaos.pruned_jobs;

-- name: ops_retries
-- No job that a retry or replay acknowledged is lost: it still exists (and then must
-- be final, ops_final), or retention deleted it in a final state. The copy of a
-- deleted row is its last version, and a retry's answer means that the row existed
-- after the retry (a deleted one answers 404), so a copy in a final state finished
-- after the retry; one in any other state is a job retention took while it was
-- queued, waiting or running.
SELECT count(*) AS acknowledged,
       count(DISTINCT a.job_id) AS jobs,
       count(*) FILTER (WHERE a.via = 'store-bulk') AS by_bulk_replay,
       count(*) FILTER (WHERE p.id IS NOT NULL) AS pruned_later,
       count(*) FILTER (WHERE j.id IS NULL AND (p.id IS NULL OR p.state NOT IN
                              ('succeeded', 'dead', 'cancelled'))) AS lost,
       count(DISTINCT a.job_id) FILTER (WHERE j.id IS NULL AND (p.id IS NULL OR p.state
                              NOT IN ('succeeded', 'dead', 'cancelled'))) AS jobs_lost
FROM chaos.acks a
LEFT JOIN deadman.jobs j ON j.id = a.job_id
LEFT JOIN chaos.pruned_jobs p ON p.id = a.job_id
WHERE a.kind = 'retry' AND a.acked;

-- name: ops_cancel_fence
-- No attempt started after its job's cancel was acknowledged, unless a retry was
-- sent in between (answered or not: one that got no answer may have committed).
-- Claimed after the cancel, either of:
-- * by token: a cancel answered 202 names the lease token of the attempt in flight;
--   a larger token of the same job (an attempt row, or the invocation or effect its
--   handler wrote, which survive a lost attempt row) is a later claim, made once the
--   attempt in flight had ended, after the cancel;
-- * by time: an attempt whose claim started (started_at) after the cancel's db_hi.
-- Claimed before the next retry: its token is at most the retry's token_lo.
WITH cancels AS MATERIALIZED (
    SELECT c.seq, c.job_id, c.token, c.db_hi,
           (SELECT min(r.token_lo) FROM chaos.acks r
            WHERE r.kind = 'retry' AND r.job_id = c.job_id AND r.seq > c.seq) AS retry_token
    FROM chaos.acks c
    WHERE c.kind = 'cancel' AND c.acked
), attempts AS MATERIALIZED (
    SELECT job_id, lease_token, started_at FROM deadman.attempts
    UNION ALL
    SELECT job_id, lease_token, started_at FROM chaos.pruned_attempts
), tokens AS MATERIALIZED (
    SELECT job_id, lease_token FROM attempts
    UNION
    SELECT job_id, lease_token FROM deadman.chaos_invocations
    UNION
    SELECT job_id, lease_token FROM deadman.effects
), violations AS (
    SELECT c.seq, c.job_id, t.lease_token
    FROM cancels c JOIN tokens t ON t.job_id = c.job_id
    WHERE c.token IS NOT NULL AND t.lease_token > c.token
      AND (c.retry_token IS NULL OR t.lease_token <= c.retry_token)
    UNION
    SELECT c.seq, c.job_id, a.lease_token
    FROM cancels c JOIN attempts a ON a.job_id = c.job_id
    WHERE c.db_hi IS NOT NULL AND a.started_at > c.db_hi
      AND (c.retry_token IS NULL OR a.lease_token <= c.retry_token)
)
SELECT (SELECT count(*) FROM cancels) AS acknowledged,
       (SELECT count(*) FROM cancels WHERE token IS NOT NULL) AS of_running_with_token,
       (SELECT count(*) FROM chaos.acks
        WHERE kind = 'cancel' AND acked AND via = 'store-workflow') AS by_workflow_cancel,
       (SELECT count(DISTINCT (seq, lease_token)) FROM violations) AS attempts_after_cancel,
       (SELECT count(DISTINCT job_id) FROM violations) AS jobs;

-- name: ops_cancel_outcome
-- A job whose last acknowledged action was a cancel ends cancelled; it may end
-- succeeded only if the cancel found it running (the attempt in flight won).
WITH last AS (
    -- an unanswered retry counts: it may have reopened the job
    SELECT DISTINCT ON (job_id) job_id, kind, state
    FROM chaos.acks WHERE job_id IS NOT NULL AND kind IN ('cancel', 'retry')
    ORDER BY job_id, seq DESC
), every AS (
    SELECT id, state FROM deadman.jobs
    UNION ALL
    SELECT id, state FROM chaos.pruned_jobs
)
SELECT count(*) AS cancelled_last,
       count(*) FILTER (WHERE e.state = 'cancelled') AS ended_cancelled,
       count(*) FILTER (WHERE e.state = 'succeeded' AND l.state = 'running')
           AS in_flight_attempt_won,
       count(*) FILTER (WHERE e.state IS NULL) AS vanished,
       count(*) FILTER (WHERE e.state IS NULL OR NOT (e.state = 'cancelled'
                              OR (e.state = 'succeeded' AND l.state = 'running')))
           AS not_honoured
FROM last l LEFT JOIN every e ON e.id = l.job_id
WHERE l.kind = 'cancel';

-- name: view_pause_windows
-- Views over the journal, made when it is loaded (acks_load): the pause windows, and
-- every attempt claimed inside one; ops_paused counts them, the example lists them.
-- A window: an acknowledged pause from its db_hi until the token_lo of the queue's
-- next resume (a resume that got no answer ends the window too). Claimed inside it:
-- started after the pause's db_hi, with a token no larger than that token_lo.
CREATE OR REPLACE VIEW chaos.pauses AS
SELECT p.seq, p.queue, p.db_hi,
       (SELECT min(r.token_lo) FROM chaos.acks r
        WHERE r.kind = 'resume' AND r.queue = p.queue AND r.seq > p.seq) AS resume_token
FROM chaos.acks p
WHERE p.kind = 'pause' AND p.acked AND p.db_hi IS NOT NULL;
CREATE OR REPLACE VIEW chaos.attempts_while_paused AS
WITH pauses AS MATERIALIZED (
    SELECT seq, queue, db_hi, resume_token FROM chaos.pauses
), every AS (
    SELECT id, queue FROM deadman.jobs
    UNION ALL
    SELECT id, queue FROM chaos.pruned_jobs
), attempts AS MATERIALIZED (
    SELECT a.job_id, a.lease_token, a.started_at, a.outcome, a.worker, e.queue
    FROM (SELECT job_id, lease_token, started_at, outcome, worker FROM deadman.attempts
          UNION ALL
          SELECT job_id, lease_token, started_at, outcome, worker
          FROM chaos.pruned_attempts) AS a
    JOIN every e ON e.id = a.job_id
)
SELECT p.seq, p.queue, p.db_hi AS paused_hi, p.resume_token, a.job_id, a.lease_token,
       a.started_at, a.outcome, a.worker
FROM pauses p
JOIN attempts a ON a.queue = p.queue AND a.started_at > p.db_hi
               AND (p.resume_token IS NULL OR a.lease_token <= p.resume_token);

-- name: ops_paused
-- No attempt of a queue was claimed while the queue was paused (view_pause_windows).
SELECT (SELECT count(*) FROM chaos.pauses) AS pauses,
       (SELECT count(*) FROM chaos.pauses WHERE resume_token IS NULL) AS never_resumed,
       (SELECT count(DISTINCT lease_token) FROM chaos.attempts_while_paused)
           AS attempts_while_paused;

-- name: ops_final
-- Every job ends in a final state; every workflow finishes once all its nodes are
-- final, with the verdict its nodes give, and its counter matches its nodes.
WITH every AS (
    SELECT id, state, workflow_id FROM deadman.jobs
    UNION ALL
    SELECT id, state, workflow_id FROM chaos.pruned_jobs
), nodes AS (
    SELECT workflow_id,
           count(*) AS n,
           count(*) FILTER (WHERE state NOT IN ('succeeded', 'dead', 'cancelled'))
               AS unfinished,
           count(*) FILTER (WHERE state = 'dead') AS dead,
           count(*) FILTER (WHERE state = 'cancelled') AS cancelled
    FROM every WHERE workflow_id IS NOT NULL
    GROUP BY workflow_id
), wf AS (
    SELECT id, state, nodes, unfinished FROM deadman.workflows
    UNION ALL
    SELECT id, state, nodes, unfinished FROM chaos.pruned_workflows
)
SELECT (SELECT count(*) FROM deadman.jobs
        WHERE state NOT IN ('succeeded', 'dead', 'cancelled')) AS jobs_unfinished,
       (SELECT count(*) FROM every WHERE state = 'succeeded') AS succeeded,
       (SELECT count(*) FROM every WHERE state = 'dead') AS dead,
       (SELECT count(*) FROM every WHERE state = 'cancelled') AS cancelled,
       count(*) AS workflows,
       count(*) FILTER (WHERE w.state = 'running') AS workflows_unfinished,
       count(*) FILTER (WHERE w.state = 'running' AND COALESCE(n.unfinished, 0) = 0)
           AS workflows_stuck,
       count(*) FILTER (WHERE COALESCE(n.n, 0) <> w.nodes) AS workflows_nodes_missing,
       count(*) FILTER (WHERE w.state <> 'running' AND w.unfinished <> 0
                           OR w.state = 'running' AND w.unfinished <> n.unfinished)
           AS workflows_counter_wrong,
       count(*) FILTER (WHERE w.state <> 'running' AND w.state <> CASE
                            WHEN n.dead > 0 THEN 'failed'
                            WHEN n.cancelled > 0 THEN 'cancelled'
                            ELSE 'succeeded' END) AS workflows_verdict_wrong,
       count(*) FILTER (WHERE w.state = 'failed') AS workflows_failed,
       count(*) FILTER (WHERE w.state = 'cancelled') AS workflows_cancelled
FROM wf w LEFT JOIN nodes n ON n.workflow_id = w.id;

-- name: ops_effects
-- The fence under operators: at most one effect per job, each written under the
-- lease of an attempt that succeeded.
WITH attempts AS (
    SELECT job_id, lease_token, outcome FROM deadman.attempts
    UNION ALL
    SELECT job_id, lease_token, outcome FROM chaos.pruned_attempts
)
SELECT (SELECT count(*) FROM deadman.effects) AS effects,
       (SELECT count(*) FROM (SELECT job_id FROM deadman.effects GROUP BY job_id
                              HAVING count(*) > 1) AS d) AS doubled_jobs,
       (SELECT count(*) FROM deadman.effects e
        WHERE NOT EXISTS (SELECT 1 FROM attempts a
                          WHERE a.lease_token = e.lease_token AND a.job_id = e.job_id
                            AND a.outcome = 'succeeded')) AS outside_fence,
       (SELECT count(*) FROM attempts) AS attempts,
       (SELECT count(*) FROM attempts WHERE outcome = 'lease_expired') AS rescues;

-- Examples for the report (rows, not counts): what a failed check found.

-- name: example_retries_lost
SELECT a.seq, a.job_id, a.via, a.db_lo, p.state AS deleted_in_state, p.deleted_at
FROM chaos.acks a
LEFT JOIN deadman.jobs j ON j.id = a.job_id
LEFT JOIN chaos.pruned_jobs p ON p.id = a.job_id
WHERE a.kind = 'retry' AND a.acked AND j.id IS NULL
  AND (p.id IS NULL OR p.state NOT IN ('succeeded', 'dead', 'cancelled'))
ORDER BY a.seq
LIMIT 10;

-- name: example_attempts_after_cancel
-- (attempt rows only; ops_cancel_fence also counts invocations and effects)
WITH cancels AS MATERIALIZED (
    SELECT c.*,
           (SELECT min(r.token_lo) FROM chaos.acks r
            WHERE r.kind = 'retry' AND r.job_id = c.job_id AND r.seq > c.seq) AS retry_token
    FROM chaos.acks c
    WHERE c.kind = 'cancel' AND c.acked
), attempts AS MATERIALIZED (
    SELECT job_id, lease_token, started_at, outcome FROM deadman.attempts
    UNION ALL
    SELECT job_id, lease_token, started_at, outcome FROM chaos.pruned_attempts
)
SELECT c.seq, c.job_id, c.via, c.state AS cancel_answered, c.token AS cancel_token,
       c.db_hi AS cancel_hi, c.retry_token, a.lease_token, a.started_at, a.outcome
FROM cancels c
JOIN attempts a ON a.job_id = c.job_id
WHERE (a.lease_token > c.token OR a.started_at > c.db_hi)
  AND (c.retry_token IS NULL OR a.lease_token <= c.retry_token)
ORDER BY c.seq, a.lease_token
LIMIT 10;

-- name: example_attempts_while_paused
SELECT * FROM chaos.attempts_while_paused
ORDER BY seq
LIMIT 10;
