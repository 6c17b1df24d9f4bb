-- Two index entries fewer per job at enqueue and two at its finish (issue 16;
-- DECISIONS 79). jobs_list_queue_idx and jobs_list_type_idx served `GET /jobs?queue=`
-- and `?type=` in id order; every job entered both when it was enqueued and again
-- when it finished (a state change is never a HOT update). A listing filtered by
-- queue or type that can reach succeeded jobs now walks the primary key backwards
-- through a window of jobs (deadman.bounds.LIST_WINDOW) per page, and its cursor
-- resumes below the window when the window ran out before the page filled
-- (job_list_floor, deadman.store.reads.job_page). Filtered by a state other than succeeded, the
-- listing walks jobs_list_state_idx (or jobs_running_idx), whose rows are the backlog
-- and the failures, as before.
DROP INDEX deadman.jobs_list_queue_idx;
DROP INDEX deadman.jobs_list_type_idx;
