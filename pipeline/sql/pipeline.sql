-- replay_lock_runs --
-- Lock an inquiry's ledger rows in the fixed stage order before a replay decides and
-- writes (pipeline/replay.py says why this order cannot deadlock). Rows are locked in
-- the order they are sorted; a row a closing transaction holds is waited for and then
-- returned as committed.
SELECT stage, status, lease_expires_at, coalesce(lease_expires_at > now(), false)
  FROM pipeline_runs
 WHERE tenant_id = %(tenant_id)s AND anfrage_id = %(anfrage_id)s
 ORDER BY array_position(%(stages)s::text[], stage::text)
   FOR UPDATE;

-- replay_reset --
-- Reopen successful stages for an audited replay: compare-and-set on 'success', so of two
-- concurrent replays only the first reopens a row (the second finds it reopened already).
-- The row becomes claimable ('failed' with the replay as its reason); attempts stay, so
-- the fencing tokens keep growing.
UPDATE pipeline_runs
   SET status = 'failed', error = %(reason)s, finished_at = now(), lease_expires_at = NULL
 WHERE tenant_id = %(tenant_id)s
   AND anfrage_id = %(anfrage_id)s
   AND stage = ANY(%(stages)s)
   AND status = 'success'
RETURNING stage;

-- replay_mark_waiting --
-- A failed target of a replay (one a forced replay did not reset: it had not succeeded)
-- gets the replay's reason in front of its error, so it reads as waiting for the replay
-- until its next claim clears the error. Rows already waiting are left as they are.
UPDATE pipeline_runs
   SET error = %(reason)s || '; last error: ' || error
 WHERE tenant_id = %(tenant_id)s
   AND anfrage_id = %(anfrage_id)s
   AND stage = ANY(%(stages)s)
   AND status = 'failed'
   AND error NOT LIKE %(prefix)s;

-- replay_clear_resumes --
-- A replay gives the replayed stages a fresh resume budget and lifts a give-up.
UPDATE pipeline_runs
   SET resumes = 0, gave_up_at = NULL
 WHERE tenant_id = %(tenant_id)s
   AND anfrage_id = %(anfrage_id)s
   AND stage = ANY(%(stages)s)
   AND (resumes <> 0 OR gave_up_at IS NOT NULL);

-- anfrage_reopen --
-- A replay puts the inquiry back among those in flight (the resume sweep reads only
-- those). The guard writes nothing when it already is.
UPDATE anfragen SET completed_at = NULL WHERE id = %(anfrage_id)s AND completed_at IS NOT NULL;

-- replayable_runs --
-- Runs of one stage that need a replay: failed, or abandoned while running (lease
-- expired, its job gone), whose earlier stages all succeeded. Oldest first.
SELECT r.tenant_id, r.anfrage_id
  FROM pipeline_runs r
 WHERE r.stage = %(stage)s
   AND (%(tenant_id)s::bigint IS NULL OR r.tenant_id = %(tenant_id)s::bigint)
   AND (r.status = 'failed' OR (r.status = 'running' AND r.lease_expires_at < now()))
   AND (SELECT count(*)
          FROM pipeline_runs p
         WHERE p.tenant_id = r.tenant_id
           AND p.anfrage_id = r.anfrage_id
           AND p.stage = ANY(%(previous)s)
           AND p.status = 'success') = cardinality(%(previous)s::text[])
 ORDER BY r.id
 LIMIT %(limit)s;

-- staged_blobs_in_use --
-- Of the given blob hashes, those that an inquiry still needs: one whose intake has not
-- succeeded yet names it in its upload manifest. An intake that failed and stayed failed
-- for the whole grace period (an unreadable upload, refused for good) needs it no more.
SELECT DISTINCT u.entry ->> 'sha256'
  FROM anfragen a
 CROSS JOIN LATERAL jsonb_array_elements(a.uploads) AS u(entry)
 WHERE u.entry ->> 'sha256' = ANY(%(hashes)s)
   AND NOT EXISTS (
        SELECT 1 FROM pipeline_runs r
         WHERE r.tenant_id = a.tenant_id AND r.anfrage_id = a.id
           AND r.stage = 'intake'
           AND (r.status = 'success'
                OR (r.status = 'failed'
                    AND r.finished_at < now() - make_interval(secs => %(grace)s))));

-- resume_without_jit --
-- For the resume sweep's transaction: once open inquiries number in the thousands, the
-- candidates' plan costs enough for PostgreSQL to JIT-compile it, and compiling takes
-- longer than the query (measured: 240 ms instead of 140 ms at 10,000 open inquiries,
-- 3.7 s instead of 1.7 s at 100,000).
SET LOCAL jit = off;

-- resume_candidates --
-- Open inquiries whose pipeline stopped: the first stage that is not 'success' has no
-- ledger row, a 'failed' one, or a 'running' one whose lease expired; the sweep has not
-- given up on it; it has been idle for the grace period (since it failed, its lease ran
-- out, or the stage before it succeeded); and no job of its stage key is waiting or
-- running. Also open inquiries whose stages all succeeded (stage NULL: a replay without
-- --cascade ran an earlier stage again), to be closed. Only open inquiries are read
-- (partial index anfragen_open_idx), oldest first. FOR NO KEY UPDATE rather than FOR
-- UPDATE: inserts that reference the inquiry (a claim, positions) take KEY SHARE and are
-- not blocked by the sweep. The stage job's queueing lock comes from its one builder as
-- a template (%(lock_template)s) whose markers are filled in per row. 'todo' and 'doing'
-- are probed apart: procrastinate's unique index on queueing_lock covers 'todo', and the
-- 'doing' jobs are few (one per busy worker thread); one probe for both would read every
-- waiting job, a backlog's worth, for each inquiry.
SELECT a.id, a.tenant_id, s.stage, s.run_id, coalesce(s.resumes, 0), coalesce(s.error, '')
  FROM anfragen a
  JOIN tenants t ON t.id = a.tenant_id
  LEFT JOIN LATERAL (
        SELECT o.stage, o.ord, r.id AS run_id, r.status, r.resumes, r.error, r.gave_up_at,
               r.lease_expires_at, r.finished_at
          FROM unnest(%(stages)s::text[]) WITH ORDINALITY AS o(stage, ord)
          LEFT JOIN pipeline_runs r
                 ON r.tenant_id = a.tenant_id AND r.anfrage_id = a.id AND r.stage = o.stage
         WHERE r.status IS DISTINCT FROM 'success'
         ORDER BY o.ord
         LIMIT 1) s ON true
 WHERE a.completed_at IS NULL
   AND (%(anfrage_id)s::bigint IS NULL OR a.id = %(anfrage_id)s::bigint)
   AND (s.stage IS NULL
        OR (s.gave_up_at IS NULL
            AND (s.status IS NULL
                 OR s.status = 'failed'
                 OR (s.status = 'running' AND s.lease_expires_at < now()))
            AND coalesce(s.lease_expires_at,
                         s.finished_at,
                         (SELECT p.finished_at
                            FROM pipeline_runs p
                           WHERE p.tenant_id = a.tenant_id AND p.anfrage_id = a.id
                             AND p.stage = (%(stages)s::text[])[s.ord - 1]),
                         a.created_at) < now() - %(grace_seconds)s * interval '1 second'
            AND NOT EXISTS (
                SELECT 1
                  FROM procrastinate_jobs j
                 WHERE j.queueing_lock = replace(replace(replace(%(lock_template)s,
                           '@stage@', s.stage), '@tenant@', t.slug), '@anfrage@', a.id::text)
                   AND j.status = 'todo')
            AND NOT EXISTS (
                SELECT 1
                  FROM procrastinate_jobs j
                 WHERE j.queueing_lock = replace(replace(replace(%(lock_template)s,
                           '@stage@', s.stage), '@tenant@', t.slug), '@anfrage@', a.id::text)
                   AND j.status = 'doing')))
 ORDER BY a.id
 LIMIT %(limit)s
   FOR NO KEY UPDATE OF a SKIP LOCKED;

-- resume_lock_run --
-- Lock the stopped stage's ledger row without waiting and re-check it: a row someone
-- holds (a replay, a claim) is being worked on, and the sweep holds the inquiry's row, so
-- waiting here could deadlock with a replay (which locks ledger rows first).
SELECT resumes, error
  FROM pipeline_runs
 WHERE id = %(run_id)s
   AND gave_up_at IS NULL
   AND (status = 'failed' OR (status = 'running' AND lease_expires_at < now()))
   FOR UPDATE SKIP LOCKED;

-- resume_record --
-- Count one resume on the stage's ledger row, once its job was created. A stage whose job
-- was lost before any claim gets a 'failed' row saying so (the claim takes failed rows;
-- attempts 0, so its first claim is token 1); an existing row keeps status and error.
INSERT INTO pipeline_runs AS r (tenant_id, anfrage_id, stage, status, attempts, input_hash,
                                finished_at, error, resumes)
VALUES (%(tenant_id)s, %(anfrage_id)s, %(stage)s, 'failed', 0, '', now(), %(error)s, 1)
ON CONFLICT (tenant_id, anfrage_id, stage) DO UPDATE
   SET resumes = r.resumes + 1
 WHERE r.status <> 'success'
RETURNING r.resumes;

-- resume_give_up --
-- Stop resuming a stage: 'failed' with the reason, visible, and never picked by the sweep
-- again (gave_up_at) until a replay clears it; a stage whose job was lost before any
-- claim gets such a row. The caller holds an existing row's lock (resume_lock_run). It
-- fences off a worker that still holds a lapsed lease: its complete needs 'running'.
INSERT INTO pipeline_runs AS r (tenant_id, anfrage_id, stage, status, attempts, input_hash,
                                finished_at, error, gave_up_at)
VALUES (%(tenant_id)s, %(anfrage_id)s, %(stage)s, 'failed', 0, '', now(), %(error)s, now())
ON CONFLICT (tenant_id, anfrage_id, stage) DO UPDATE
   SET status = 'failed',
       gave_up_at = now(),
       lease_expires_at = NULL,
       finished_at = coalesce(r.finished_at, now()),
       error = EXCLUDED.error
 WHERE r.gave_up_at IS NULL AND r.status <> 'success'
RETURNING r.id;

-- anfrage_close --
-- Close an open inquiry whose stages all succeeded; re-checked in the statement.
UPDATE anfragen a
   SET completed_at = now()
 WHERE a.id = %(anfrage_id)s
   AND a.completed_at IS NULL
   AND (SELECT count(*)
          FROM pipeline_runs r
         WHERE r.tenant_id = a.tenant_id
           AND r.anfrage_id = a.id
           AND r.stage = ANY(%(stages)s)
           AND r.status = 'success') = cardinality(%(stages)s::text[])
RETURNING a.id;

-- stage_input --
-- A stage's first read, one statement: the inquiry, its tenant's slug, the status and
-- token of the stage before (NULL: none, or no row yet) and, as {input}, the stage's
-- input (one of the stage_input_* blocks, so a stage reads no table it does not need: a
-- migration locking the positions holds up no intake). Token and input come from
-- one snapshot, so an unchanged token at the close vouches that the input is the stage
-- before's current output.
SELECT a.id, a.tenant_id, t.slug, r.status, r.attempts, {input}
  FROM anfragen a
  JOIN tenants t ON t.id = a.tenant_id
  LEFT JOIN pipeline_runs r
         ON r.tenant_id = a.tenant_id AND r.anfrage_id = a.id AND r.stage = %(previous)s::text
 WHERE a.id = %(anfrage_id)s::bigint;

-- stage_input_manifest --
-- Intake's input (a fragment of stage_input): the upload manifest, a column of the
-- inquiry. JSON is returned as text: how a JSON column is loaded depends on the
-- connection.
a.uploads::text

-- stage_input_files --
-- Extract's input (a fragment of stage_input): the inquiry's files in id order, as JSON
-- text.
(SELECT coalesce(json_agg(json_build_object(
            'id', f.id, 'filename', f.filename, 'sha256', f.sha256,
            'storage_key', f.storage_key, 'format', f.format) ORDER BY f.id), '[]')::text
   FROM anfrage_files f
  WHERE f.anfrage_id = a.id)

-- stage_input_positions --
-- The input of feasibility and calculate (a fragment of stage_input): the inquiry's
-- positions in index order, as JSON text; quantities as strings, which JSON would make
-- floats. The tenant's catalog is no input of the stage before: it is read after the
-- claim (stage_catalog).
(SELECT coalesce(json_agg(json_build_object(
            'id', p.id, 'position_index', p.position_index, 'item', p.item,
            'quantity', p.quantity::text, 'unit', p.unit, 'material', p.material,
            'length_mm', p.length_mm, 'catalog_item', p.catalog_item,
            'feasible', p.feasible) ORDER BY p.position_index), '[]')::text
   FROM anfrage_positions p
  WHERE p.tenant_id = a.tenant_id AND p.anfrage_id = a.id)

-- stage_catalog --
-- The tenant's own catalog as JSON text (no row: it has none), read by feasibility and
-- calculate after their claim: an operator who changes prices and then replays the stage
-- reopens its ledger row first, so a run that claims after the replay reads the new
-- catalog, and one that claimed before is fenced off by the replay. Read before the
-- claim, a run could price with the old catalog under the replay's claim.
SELECT json_build_object(
           'name', c.name, 'currency', c.currency, 'materials', c.materials,
           'items', (SELECT coalesce(json_agg(json_build_object(
                               'code', i.code, 'name', i.name, 'keywords', i.keywords,
                               'materials', i.materials, 'unit', i.unit,
                               'max_length_mm', i.max_length_mm,
                               'min_quantity', i.min_quantity::text,
                               'price_breaks', i.price_breaks)
                               ORDER BY i.sort_order, i.id), '[]')
                       FROM catalog_items i
                      WHERE i.catalog_id = c.id))::text
  FROM catalogs c
 WHERE c.tenant_id = %(tenant_id)s::bigint;

-- intake_write --
-- Intake's closing write, one statement: the inquiry's distinct files, in the order they
-- were uploaded (extract reads them in id order), each inserted unless its (sha256,
-- storage_key) is in the table; and one 'file.stored' audit entry per uploaded file,
-- naming the id that is in the table: the row just inserted (created), or the one that
-- conflicted (a duplicate upload, a replayed intake), as this statement's snapshot holds
-- it. A conflicting row that another transaction committed while the INSERT waited for
-- it is not in that snapshot: its uploads get no entry here and are returned, for the
-- caller to look up in a statement of its own, never guessed.
WITH files AS (
    SELECT *
      FROM unnest(%(sha256s)s::text[], %(storage_keys)s::text[], %(sizes)s::bigint[],
                  %(filenames)s::text[], %(formats)s::text[])
           WITH ORDINALITY AS f(sha256, storage_key, size, filename, format, n)
), inserted AS (
    INSERT INTO anfrage_files (tenant_id, anfrage_id, sha256, storage_key, size, filename,
                               format)
    SELECT %(tenant_id)s, %(anfrage_id)s, sha256, storage_key, size, filename, format
      FROM files
     ORDER BY n
        ON CONFLICT (sha256, storage_key) DO NOTHING
    RETURNING id, sha256, storage_key
), uploads AS (
    SELECT u.n, u.filename, f.sha256, f.storage_key, coalesce(i.id, e.id) AS id,
           (i.id IS NOT NULL AND u.first) AS created
      FROM unnest(%(upload_files)s::bigint[], %(upload_filenames)s::text[],
                  %(upload_first)s::boolean[]) WITH ORDINALITY AS u(file, filename, first, n)
      JOIN files f ON f.n = u.file
      LEFT JOIN inserted i ON i.sha256 = f.sha256 AND i.storage_key = f.storage_key
      LEFT JOIN anfrage_files e ON e.sha256 = f.sha256 AND e.storage_key = f.storage_key
), audited AS (
    INSERT INTO audit_log (tenant_id, entity_type, entity_id, action, actor, payload)
    SELECT %(tenant_id)s, 'anfrage_file', id, 'file.stored', %(actor)s,
           jsonb_build_object('anfrage_id', %(anfrage_id)s::bigint, 'created', created,
                              'filename', filename, 'sha256', sha256,
                              'storage_key', storage_key)
      FROM uploads
     WHERE id IS NOT NULL
     ORDER BY n
)
SELECT n FROM uploads WHERE id IS NULL ORDER BY n;

-- extract_write --
-- Extract's closing write, one statement: the inquiry's positions and warnings replaced,
-- DELETE before INSERT (as replace_children does: a retry never trips the positions'
-- unique key; until the transaction commits, readers see the old rows, and a failure
-- keeps them), each in the order given (warnings are shown in id order); and the
-- inquiry's old quote cleared: it is in flight again. The parts of one statement run in
-- no set order, so each INSERT first counts the rows its DELETE returned, which runs
-- that DELETE to its end; the rows it deletes are then no conflict (deleted by this
-- transaction), and the rows inserted are not in the DELETE's snapshot.
WITH old_positions AS (
    DELETE FROM anfrage_positions
     WHERE tenant_id = %(tenant_id)s AND anfrage_id = %(anfrage_id)s
    RETURNING 1
), old_warnings AS (
    DELETE FROM anfrage_warnings
     WHERE tenant_id = %(tenant_id)s AND anfrage_id = %(anfrage_id)s
    RETURNING 1
), positions AS (
    INSERT INTO anfrage_positions (tenant_id, anfrage_id, position_index, source_file_id,
                                   source_line, label, raw, quantity, unit, item, material,
                                   length_mm, catalog_item, catalog_material, feasible,
                                   reason, unit_price, total)
    SELECT %(tenant_id)s, %(anfrage_id)s, p.position_index, p.source_file_id,
           p.source_line, p.label, p.raw, p.quantity, p.unit, p.item, p.material,
           p.length_mm, '', '', NULL, '', NULL, NULL
      FROM unnest(%(indexes)s::int[], %(files)s::bigint[], %(lines)s::int[],
                  %(labels)s::text[], %(raws)s::text[], %(quantities)s::numeric[],
                  %(units)s::text[], %(items)s::text[], %(materials)s::text[],
                  %(lengths)s::int[])
           WITH ORDINALITY AS p(position_index, source_file_id, source_line, label, raw,
                                quantity, unit, item, material, length_mm, n)
     WHERE (SELECT count(*) FROM old_positions) >= 0
     ORDER BY p.n
), warnings AS (
    INSERT INTO anfrage_warnings (tenant_id, anfrage_id, source_file_id, line_no, line,
                                  message)
    SELECT %(tenant_id)s, %(anfrage_id)s, w.source_file_id, w.line_no, w.line, w.message
      FROM unnest(%(warning_files)s::bigint[], %(warning_lines)s::int[],
                  %(warning_texts)s::text[], %(warning_messages)s::text[])
           WITH ORDINALITY AS w(source_file_id, line_no, line, message, n)
     WHERE (SELECT count(*) FROM old_warnings) >= 0
     ORDER BY w.n
)
UPDATE anfragen
   SET quote_total = NULL, currency = '', completed_at = NULL
 WHERE id = %(anfrage_id)s;

-- feasibility_write --
-- Feasibility's closing write, one statement: each position's verdict (matched by id
-- within the inquiry; a position replaced meanwhile matches nothing), and the inquiry's
-- old quote cleared: it is in flight again.
WITH verdicts AS (
    SELECT *
      FROM unnest(%(ids)s::bigint[], %(feasible)s::boolean[], %(reasons)s::text[],
                  %(catalog_items)s::text[], %(catalog_materials)s::text[])
           AS v(id, feasible, reason, catalog_item, catalog_material)
), written AS (
    UPDATE anfrage_positions p
       SET feasible = v.feasible, reason = v.reason, catalog_item = v.catalog_item,
           catalog_material = v.catalog_material, unit_price = NULL, total = NULL
      FROM verdicts v
     WHERE p.id = v.id AND p.tenant_id = %(tenant_id)s AND p.anfrage_id = %(anfrage_id)s
)
UPDATE anfragen
   SET quote_total = NULL, currency = '', completed_at = NULL
 WHERE id = %(anfrage_id)s;

-- calculate_write --
-- Calculate's closing write, one statement: each position's price (matched by id within
-- the inquiry), and the quote with completed_at in the same UPDATE of the inquiry, set
-- only when every earlier stage is still 'success' (a replay without --cascade may have
-- reopened one meanwhile).
WITH prices AS (
    SELECT *
      FROM unnest(%(ids)s::bigint[], %(unit_prices)s::numeric[], %(totals)s::numeric[])
           AS v(id, unit_price, total)
), written AS (
    UPDATE anfrage_positions p
       SET unit_price = v.unit_price, total = v.total
      FROM prices v
     WHERE p.id = v.id AND p.tenant_id = %(tenant_id)s AND p.anfrage_id = %(anfrage_id)s
)
UPDATE anfragen a
   SET quote_total = %(total)s,
       currency = %(currency)s,
       completed_at = CASE WHEN NOT EXISTS (
                          SELECT 1 FROM pipeline_runs r
                           WHERE r.tenant_id = a.tenant_id AND r.anfrage_id = a.id
                             AND r.stage = ANY(%(earlier)s) AND r.status <> 'success')
                      THEN now() END
 WHERE a.id = %(anfrage_id)s;
