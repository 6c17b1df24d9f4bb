-- Retention for workflows. Retention deletes finished jobs, workflow nodes among
-- them; a finished workflow whose nodes are all gone is deleted too (the rescuer,
-- workflow_prune_finished), so workflow rows and their idempotency keys do not pile
-- up for ever. Finished workflows only, oldest first along this index.
CREATE INDEX workflows_finished_idx ON deadman.workflows (finished_at)
    WHERE state <> 'running';
