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
-- Registered workers: alive (a heartbeat within %(threshold)s seconds) and silent; and of
-- the alive ones, the slots hung runs hold (queueing.timeouts, as each worker's last beat
-- counted them) and how many have every slot held so.
SELECT count(*) FILTER (WHERE w.last_heartbeat >= now() - make_interval(secs => %(threshold)s)),
       count(*) FILTER (WHERE w.last_heartbeat < now() - make_interval(secs => %(threshold)s)),
       coalesce(sum(t.hung_slots) FILTER (
           WHERE w.last_heartbeat >= now() - make_interval(secs => %(threshold)s)), 0),
       count(*) FILTER (
           WHERE w.last_heartbeat >= now() - make_interval(secs => %(threshold)s)
             AND t.slots > 0 AND t.hung_slots >= t.slots)
  FROM procrastinate_workers w
  LEFT JOIN pgstage_worker_tasks t ON t.worker_id = w.id;

-- inline_sweeps --
-- Each inline sweep's seconds since its last run (on any worker).
SELECT name, extract(epoch FROM now() - last_run)
  FROM pgstage_inline_sweeps
 ORDER BY name;
