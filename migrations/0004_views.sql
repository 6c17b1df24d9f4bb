-- Views for looking at Deadman with plain SQL (psql at 3 a.m.), and a role that can
-- read them and nothing else. Every view is answered from an index on a big table:
-- none counts finished jobs (that would scan the table); recent_throughput reads
-- jobs_finished_idx over the last hour only.

-- Per queue: pending work by state, how late the oldest due job is, paused or not.
CREATE VIEW deadman.queue_summary AS
WITH names AS (
    SELECT DISTINCT queue AS name FROM deadman.jobs
    WHERE state IN ('queued', 'scheduled', 'retrying', 'running')
    UNION
    SELECT name FROM deadman.queues
)
SELECT n.name AS queue,
       COALESCE(q.paused, false) AS paused,
       (SELECT count(*) FROM deadman.jobs j
         WHERE j.queue = n.name AND j.state IN ('queued', 'scheduled', 'retrying')
           AND j.run_at <= now()) AS due,
       (SELECT count(*) FROM deadman.jobs j
         WHERE j.queue = n.name AND j.state IN ('queued', 'scheduled', 'retrying')
           AND j.run_at > now()) AS later,
       (SELECT count(*) FROM deadman.jobs j
         WHERE j.queue = n.name AND j.state = 'running') AS running,
       (SELECT now() - min(j.run_at) FROM deadman.jobs j
         WHERE j.queue = n.name AND j.state IN ('queued', 'scheduled', 'retrying')
           AND j.run_at <= now()) AS oldest_due_age
FROM names n
LEFT JOIN deadman.queues q ON q.name = n.name;

-- Jobs being worked on now, with their lease and the holder's last heartbeat.
CREATE VIEW deadman.running_jobs AS
SELECT j.id, j.type, j.queue, j.attempt, j.max_attempts, j.rescues,
       j.lease_worker AS worker, j.lease_token, j.started_at,
       now() - j.started_at AS running_for,
       j.lease_expires_at, j.lease_expires_at - now() AS lease_left,
       w.last_heartbeat_at, j.cancel_requested
FROM deadman.jobs j
LEFT JOIN deadman.workers w ON w.id = j.lease_worker
WHERE j.state = 'running';

-- Leases that lapsed but were not rescued yet (should stay empty while a rescuer
-- runs; rows that linger mean no rescuer is running).
CREATE VIEW deadman.stuck_jobs AS
SELECT id, type, queue, attempt, rescues, worker, lease_token, started_at,
       lease_expires_at, -lease_left AS expired_for, last_heartbeat_at
FROM deadman.running_jobs
WHERE lease_expires_at < now();

-- The dead-letter queue: what failed for good, and why.
CREATE VIEW deadman.dead_letters AS
SELECT id, type, queue, attempt, max_attempts, rescues, finished_at, last_error,
       payload, idempotency_key
FROM deadman.jobs
WHERE state = 'dead';

-- Jobs finished per minute over the last hour, by queue and final state.
CREATE VIEW deadman.recent_throughput AS
SELECT date_trunc('minute', finished_at) AS minute, queue, state, count(*) AS jobs
FROM deadman.jobs
WHERE state IN ('succeeded', 'dead', 'cancelled')
  AND finished_at > now() - interval '1 hour'
GROUP BY 1, 2, 3;

-- deadman_reader: may read these views and nothing else (not even the tables).
-- Views run with their owner's rights, so the reader needs no grant on the tables.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'deadman_reader') THEN
        CREATE ROLE deadman_reader NOLOGIN;
    END IF;
EXCEPTION
    WHEN duplicate_object OR unique_violation THEN NULL;
END
$$;
GRANT USAGE ON SCHEMA deadman TO deadman_reader;
GRANT SELECT ON deadman.queue_summary, deadman.running_jobs, deadman.stuck_jobs,
    deadman.dead_letters, deadman.recent_throughput TO deadman_reader;
