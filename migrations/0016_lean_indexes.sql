-- Fewer index entries per job (issue 16; DECISIONS 49). Every claim and every finish
-- changes `state`, so neither is a HOT update: each inserts a new entry into every
-- index whose predicate the new row version satisfies. With the three listing
-- indexes of 0002 on all rows, a job's life (enqueue, claim, finish) made 15 index
-- entries; these predicates make it 11:
--   enqueue (queued):    pkey, claim, list_state, list_queue, list_type
--   claim (running):     pkey, running                      (was 5)
--   finish (succeeded):  pkey, finished, list_queue, list_type (was 5)
-- Running jobs are few (the fleet's slots) and have jobs_running_idx: the listing
-- reads them in a branch of their own (job_list, queue_list). Succeeded jobs are the
-- bulk of the table: listing them walks the primary key backwards, and counting them
-- stops at its cap (job_counts_finished).
DROP INDEX deadman.jobs_list_state_idx;
CREATE INDEX jobs_list_state_idx ON deadman.jobs (state, id)
    WHERE state IN ('waiting', 'scheduled', 'queued', 'retrying', 'dead', 'cancelled');
DROP INDEX deadman.jobs_list_queue_idx;
CREATE INDEX jobs_list_queue_idx ON deadman.jobs (queue, id) INCLUDE (state)
    WHERE state <> 'running';
DROP INDEX deadman.jobs_list_type_idx;
CREATE INDEX jobs_list_type_idx ON deadman.jobs (type, id) WHERE state <> 'running';
-- Counting the succeeded jobs up to job_counts_finished's cap, now that they are not
-- in jobs_list_state_idx: an index-only walk of the finished jobs, which carry their
-- state. Still one entry per job, made by its finish.
DROP INDEX deadman.jobs_finished_idx;
CREATE INDEX jobs_finished_idx ON deadman.jobs (finished_at) INCLUDE (state)
    WHERE state IN ('succeeded', 'dead', 'cancelled');
