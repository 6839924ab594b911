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

-- workers --
-- Registered workers: alive (a heartbeat within %(threshold)s seconds) and silent.
SELECT count(*) FILTER (WHERE last_heartbeat >= now() - make_interval(secs => %(threshold)s)),
       count(*) FILTER (WHERE last_heartbeat < now() - make_interval(secs => %(threshold)s))
  FROM procrastinate_workers;

-- inline_sweeps --
-- Each inline sweep's seconds since its last run (on any worker).
SELECT name, extract(epoch FROM now() - last_run)
  FROM pgstage_inline_sweeps
 ORDER BY name;
