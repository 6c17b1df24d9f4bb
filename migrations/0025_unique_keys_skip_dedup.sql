-- No deduplication pass on the indexes whose every key ends in the job's id (DECISIONS
-- 88). B-tree deduplication merges entries with equal keys; in these indexes no two
-- rows share a key, so when a leaf page fills, the pass reads every entry on it, finds
-- nothing to merge, and the page splits anyway. A bulk enqueue fills a page of
-- jobs_claim_idx and of jobs_list_state_idx every few hundred rows. Bottom-up deletion
-- of an updated row's old entries does not depend on this setting. The indexes whose
-- keys repeat (lease_worker, finished_at, deadline, start_by, limit_key) keep it.
-- ALTER INDEX ... SET takes SHARE UPDATE EXCLUSIVE on the index alone: inserts and
-- claims go on while it runs, and no index is rebuilt (pages written from now on).
ALTER INDEX deadman.jobs_claim_idx SET (deduplicate_items = off);
ALTER INDEX deadman.jobs_claim_keyed_idx SET (deduplicate_items = off);
ALTER INDEX deadman.jobs_list_state_idx SET (deduplicate_items = off);
ALTER INDEX deadman.jobs_quarantine_idx SET (deduplicate_items = off);
