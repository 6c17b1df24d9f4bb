-- A worker's parked slots are rows it keeps and reopens (DECISIONS 85), instead of rows
-- deleted when a slot is taken back and inserted when it is parked again.
--
-- A parked worker writes its rows at the rate jobs are handed to it: the enqueue fills
-- a slot, the adoption took the row (DELETE) and the next park made a new one
-- (INSERT). Deleted rows are only reclaimed by VACUUM, and autovacuum looks at a table
-- once a minute at best: at 200 handoffs a second the table grew to ~40 pages of dead
-- rows between its visits, and every enqueue's scan for a free slot walked them (the
-- enqueue call 0.95 ms -> 2.2 ms over 30 s, back to 0.93 after autovacuum). Now a
-- taken slot is closed in place (open = false) and a park reopens its row (INSERT ...
-- ON CONFLICT DO UPDATE): every write is an UPDATE of no indexed column, so a HOT
-- update, whose dead versions any later read of the page prunes; the table stays the
-- size of its live rows. fillfactor leaves each page room for those versions.
ALTER TABLE deadman.parked ADD COLUMN open boolean NOT NULL DEFAULT true;
ALTER TABLE deadman.parked SET (fillfactor = 50);
