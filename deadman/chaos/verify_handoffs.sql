-- The handoffs scenario's own figures (deadman/chaos/handoffs.py), beside verify.sql's.
-- An attempt an enqueue started itself (DECISIONS 83) began in the enqueue's own
-- statement: its start is its job's creation time. A claimed attempt starts later.

-- name: handoffs
SELECT count(*) FILTER (WHERE a.started_at = j.created_at) AS handed_attempts,
       count(*) FILTER (WHERE a.started_at = j.created_at
                          AND a.outcome = 'succeeded') AS handed_succeeded,
       -- handed to a worker that then died (or was handed so late its lease lapsed):
       -- the rescuer put the job back and another attempt ran it
       count(*) FILTER (WHERE a.started_at = j.created_at
                          AND a.outcome = 'lease_expired') AS handed_rescued,
       count(*) FILTER (WHERE a.started_at > j.created_at) AS claimed_attempts,
       count(DISTINCT j.id) FILTER (WHERE a.started_at = j.created_at) AS jobs_handed
FROM deadman.attempts a
JOIN deadman.jobs j ON j.id = a.job_id;
