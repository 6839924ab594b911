-- snapshot_save --
-- The history's metric counts, one row, replaced whole.
INSERT INTO pgstage_metrics_snapshot (id, taken_at, payload)
VALUES (1, now(), %(payload)s)
ON CONFLICT (id) DO UPDATE SET taken_at = EXCLUDED.taken_at, payload = EXCLUDED.payload;

-- snapshot_read --
-- The latest snapshot and its age in seconds.
SELECT payload, extract(epoch FROM now() - taken_at)
  FROM pgstage_metrics_snapshot
 WHERE id = 1;
