-- Claim latency right after a burst of completions (issue 16; bench/scale.py).
--
-- Measured (EXPLAIN ANALYZE and auto_explain of the claim, 200,000 jobs just run by
-- `deadman worker`, before autovacuum reached the table): 205 ms per claim against
-- 0.7 ms near-empty, of which 185 ms was JIT compilation inside job_claim_keyed and
-- 4 ms the walk over the claim index's dead entries. The keyed claim's recursive key
-- scan is costed from statistics taken when the table was smaller (the planner scales
-- the row estimate with the heap's current size), so after a burst of updates its
-- estimate (638,484) passed jit_above_cost (100,000) while it read 2 buffers and
-- found no key: every claim then compiled its plan with LLVM, about 185 ms of CPU.
-- A claim reads a handful of rows by index; JIT can only cost it time. Off for the
-- function (nested statements inherit it; the outer claim statement is costed under
-- its LIMIT, far below the threshold).
ALTER FUNCTION deadman.job_claim_keyed(text, text, bigint, integer) SET jit = off;

-- Vacuum the hot table on a count of dead tuples, not a share of its size: with a
-- scale factor, the more finished jobs the table holds (retention keeps them for a
-- day by default), the more dead claim-index entries pile up in front of the queued
-- ones before autovacuum starts. 0001 set 0.01 with a threshold of 1,000: 11,000 dead
-- tuples at 1,000,000 rows; now 5,000 whatever the size. How soon after it is due
-- autovacuum looks at the table is autovacuum_naptime, a server setting (60 s by
-- default): per-table settings cannot shorten it (see DECISIONS, claim after 1M).
ALTER TABLE deadman.jobs SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000
);
