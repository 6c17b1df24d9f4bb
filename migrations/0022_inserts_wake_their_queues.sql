-- The statements that insert jobs wake their queues themselves (DECISIONS 84).
--
-- 0001's statement trigger (jobs_notify_inserted) notified deadman_jobs with every
-- queue that got a due, scheduled or retrying job, once per inserting statement. Its
-- transition table and its PL/pgSQL call cost every single enqueue ~85 us of the
-- ~1 ms it takes, whether it woke anyone or not (a job handed off at enqueue is born
-- running and wakes no one). Each statement of queries.sql that inserts jobs now
-- sends the same notifications in a CTE of its own (job_insert, job_insert_handoff,
-- job_insert_staged, job_insert_many_returning, job_insert_grouped, workflow_insert;
-- job_ids_reserve for the COPY that follows it in the same transaction). NOTIFY is
-- transactional either way: sent at the inserter's commit, folded per queue.
--
-- What this costs: a row inserted by any other SQL wakes nobody; the workers' poll
-- (DEADMAN_POLL_S) still finds it. Clients older than this migration rely on the
-- trigger, so their jobs too are found by the poll alone until they are upgraded.
DROP TRIGGER jobs_notify_inserted ON deadman.jobs;
DROP FUNCTION deadman.notify_jobs_inserted();
