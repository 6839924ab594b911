/* The dashboard's and the detail pages' live behaviour (progressive enhancement: the
   server-rendered pages work without it).

   - Polls the JSON API while work is in flight, with capped backoff: 1 s after a change,
     then 1.6 times longer after each poll that changed nothing, at most 15 s (and at
     least the Retry-After of a 503). Rows are updated in place; the page never reloads.
   - Submits the analysis and inquiry forms through the API (session + CSRF).
   - The client save: when the page sees an analysis complete, it saves its run with
     POST /api/analysis-runs — only for the newest job of the run (an older one would be
     a stale save), once per job. The backstop sweep covers closed tabs.
   - Times read as the server renders them (config/templatetags/timestamps.py): date,
     minute and zone in UTC, then how long ago, refreshed every half minute.
   - A message about an analysis or an inquiry (data-watch="job:ID" / "anfrage:ID") goes
     once the page sees that work finished.
   - While work is in flight (or the notice is up) the page asks every few seconds whether
     a worker is alive, and shows or hides the "no worker" notice. */
(function () {
  "use strict";

  var body = document.body;
  var API = body.dataset.api || "/api/";
  var LIVE = ["queued", "pending", "running"];
  var TERMINAL = ["complete", "failed", "cancelled"];
  var STAGES = ["intake", "extract", "feasibility", "calculate"];
  var POLL = { base: 1000, cap: 15000, factor: 1.6 };
  var WORKER_POLL = 3000;
  var AGO_REFRESH = 30000;

  function csrfToken() {
    var field = document.querySelector("[name=csrfmiddlewaretoken]");
    if (field) return field.value;
    var match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  }

  /* fetch() that resolves with the parsed JSON of a 2xx and rejects with
     {status, body, retryAfter} otherwise (status 0: the network failed). */
  function call(method, path, payload) {
    var init = { method: method, credentials: "same-origin", headers: { Accept: "application/json" } };
    if (method !== "GET") init.headers["X-CSRFToken"] = csrfToken();
    if (payload instanceof FormData) {
      init.body = payload;
    } else if (payload !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(payload);
    }
    return fetch(API + path, init).then(
      function (response) {
        return response.text().then(function (text) {
          var data = null;
          try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
          if (response.ok) return { status: response.status, data: data };
          throw {
            status: response.status,
            body: data,
            retryAfter: Number(response.headers.get("Retry-After")) || 0
          };
        });
      },
      function () { throw { status: 0, body: null, retryAfter: 0 }; }
    );
  }

  function describe(error) {
    if (error && error.body && error.body.detail) {
      var detail = error.body.detail;
      if (typeof detail === "string") return detail;
      return detail.map(function (d) { return (d.loc || []).slice(1).join(".") + ": " + d.msg; }).join("; ");
    }
    return error && error.status ? "the server answered " + error.status : "the server did not answer";
  }

  /* tick() resolves to {changed, live}. Stops when nothing is live; nudge() restarts. */
  function Poller(tick) {
    var delay = POLL.base;
    var timer = null;
    var running = false;
    function schedule(ms) {
      clearTimeout(timer);
      timer = setTimeout(run, ms);
    }
    function run() {
      if (running) { schedule(delay); return; }
      running = true;
      tick().then(
        function (result) {
          running = false;
          delay = result.changed ? POLL.base : Math.min(POLL.cap, delay * POLL.factor);
          setLive(result.live);
          if (result.live) schedule(delay);
        },
        function (error) {
          running = false;
          delay = Math.min(POLL.cap, Math.max(delay * 2, (error.retryAfter || 0) * 1000));
          schedule(delay);
        }
      );
    }
    return {
      start: function () { schedule(0); },
      nudge: function () { delay = POLL.base; setLive(true); schedule(0); }
    };
  }

  function setLive(live) {
    var marker = document.getElementById("live");
    if (marker) marker.hidden = !live;
    body.dataset.inFlight = live ? "true" : "false";
  }

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (name) {
      if (name === "text") node.textContent = attrs[name];
      else if (name === "className") node.className = attrs[name];
      else node.setAttribute(name, attrs[name]);
    });
    (children || []).forEach(function (child) {
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    });
    return node;
  }

  /* A stage a replay reset or queued is "failed" in the ledger until a worker claims it:
     it is shown as waiting, and keeps the page live. */
  function shown(stage) { return stage.waiting ? "waiting" : stage.status; }

  function badge(status, extra) {
    return el("span", { className: "badge " + (extra ? extra + " " : "") + status, text: status });
  }

  function muted(text) { return el("span", { className: "muted", text: text }); }

  function ago(iso) {
    if (!iso) return "—";
    var seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    if (seconds < 60) return "just now";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min ago";
    if (seconds < 86400) return Math.floor(seconds / 3600) + " h ago";
    return Math.floor(seconds / 86400) + " d ago";
  }

  function stamp(iso) {
    return new Date(iso).toISOString().slice(0, 16).replace("T", " ") + " UTC";
  }

  /* The nodes of a time: <time>2026-12-01 19:05 UTC</time> <span class="ago">…</span>. */
  function when(iso) {
    if (!iso) return ["—"];
    var utc = new Date(iso).toISOString();
    return [
      el("time", { datetime: utc, title: utc, text: stamp(iso) }),
      " ",
      el("span", { className: "ago", "data-since": utc, text: ago(iso) })
    ];
  }

  function whenCell(iso, extra) {
    return el("td", { className: (extra ? extra + " " : "") + "when" }, when(iso));
  }

  function setWhen(cell, iso) {
    cell.textContent = "";
    when(iso).forEach(function (node) {
      cell.appendChild(typeof node === "string" ? document.createTextNode(node) : node);
    });
  }

  setInterval(function () {
    Array.prototype.forEach.call(document.querySelectorAll(".ago[data-since]"), function (span) {
      span.textContent = ago(span.dataset.since);
    });
  }, AGO_REFRESH);

  /* Replace the rows of tbody by `items`, keeping a row whose key and signature are
     unchanged (a server-rendered one keeps its content). Returns whether any changed. */
  function reconcile(tbody, items, key, signature, build) {
    var existing = {};
    Array.prototype.forEach.call(tbody.rows, function (row) { existing[row.dataset.key || row.id] = row; });
    var changed = tbody.rows.length !== items.length;
    var rows = items.map(function (item, index) {
      var id = key(item);
      var old = existing[id];
      var sig = signature(item);
      if (old && old.dataset.sig === sig) {
        if (tbody.rows[index] !== old) changed = true;
        return old;
      }
      changed = true;
      var row = build(item);
      row.id = row.id || id;
      row.dataset.key = id;
      row.dataset.sig = sig;
      return row;
    });
    rows.forEach(function (row) { tbody.appendChild(row); });
    Array.prototype.slice.call(tbody.rows).forEach(function (row) {
      if (rows.indexOf(row) < 0) tbody.removeChild(row);
    });
    var table = tbody.closest("table");
    var empty = table && table.parentNode.querySelector(".empty");
    if (table) table.hidden = items.length === 0;
    if (empty) empty.hidden = items.length !== 0;
    return changed;
  }

  /* Server-rendered rows carry data-status: give them the key and signature reconcile
     uses, so an unchanged row is kept as rendered. */
  function adopt(tbody, signature) {
    Array.prototype.forEach.call(tbody.rows, function (row) {
      row.dataset.key = row.id;
      row.dataset.sig = signature(row);
    });
  }

  /* A notice about some work (watch: "job:ID" or "anfrage:ID") stays until settle()
     sees that work finished; any other goes after 15 s. */
  function notify(content, watch) {
    var list = document.getElementById("notices");
    if (!list) return;
    var item = el("li", watch ? { "data-watch": watch } : {}, content);
    list.appendChild(item);
    if (!watch) setTimeout(function () { if (item.parentNode) list.removeChild(item); }, 15000);
  }

  /* The work named by `watch` finished: its messages have said what they had to say. */
  function settle(watch) {
    Array.prototype.forEach.call(
      document.querySelectorAll('.messages li[data-watch="' + watch + '"]'),
      function (item) { item.parentNode.removeChild(item); }
    );
  }

  /* ------------------------------------------------------------ worker notice -- */

  function watchWorkers() {
    var notice = document.getElementById("no-worker");
    if (!notice) return;
    var asking = false;
    setInterval(function () {
      if (asking || (body.dataset.inFlight !== "true" && notice.hidden)) return;
      asking = true;
      fetch(notice.dataset.url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (response) { return response.ok ? response.json() : null; })
        .then(function (state) { if (state) notice.hidden = state.alive; }, function () {})
        .then(function () { asking = false; });
    }, WORKER_POLL);
  }

  /* ---------------------------------------------------------------- client save -- */

  var saving = {};

  /* Save `job`'s run if it is complete, the newest job of its run and not saved yet. */
  function saveIfNewest(job, newestOfRun, savedUpTo) {
    if (job.status !== "complete" || newestOfRun[job.run_id] !== job.id) return Promise.resolve(false);
    if ((savedUpTo[job.run_id] || 0) >= job.id || saving[job.id]) return Promise.resolve(false);
    saving[job.id] = true;
    return call("POST", "analysis-runs", { job_id: job.id }).then(
      function (reply) { return reply.status === 201; },
      function () { saving[job.id] = false; return false; }
    );
  }

  /* ----------------------------------------------------------------- dashboard -- */

  function dashboard() {
    var liveJobs = document.getElementById("live-jobs");
    var recentJobs = document.getElementById("recent-jobs");
    var inquiryRows = document.getElementById("inquiry-rows");
    var runRows = document.getElementById("run-rows");
    var summaries = {};
    var jobSig = function (job) { return job.status + "|" + job.queue_position; };
    adopt(liveJobs, function (row) {
      var position = row.querySelector(".position").textContent.trim();
      return row.dataset.status + "|" + (/^\d+$/.test(position) ? position : "0");
    });
    adopt(recentJobs, function (row) { return row.dataset.status + "|0"; });
    adopt(inquiryRows, function (row) { return inquiryRowSig(row); });
    Array.prototype.forEach.call(recentJobs.rows, function (row) {
      summaries[row.dataset.job] = row.querySelector(".verdicts").innerHTML;
    });
    Array.prototype.forEach.call(runRows.rows, function (row) {
      row.dataset.key = "run-" + row.dataset.run;
      row.dataset.sig = row.dataset.job + "|" + row.querySelector(".badge").textContent;
    });

    function jobCells(job, last) {
      var title = el("td", {}, [el("a", { href: "analyses/" + job.id, text: job.title })]);
      if (job.delta_of_job_id) title.appendChild(muted(" (re-check of #" + job.delta_of_job_id + ")"));
      return el("tr", { "data-job": job.id, "data-run": job.run_id, "data-status": job.status }, [
        el("td", { text: String(job.id) }),
        title,
        el("td", {}, [badge(job.status, "status")]),
        last
      ]);
    }

    function liveRow(job) {
      var row = jobCells(job, el("td", { className: "position" }, [
        job.queue_position ? String(job.queue_position) : muted("—")
      ]));
      row.appendChild(whenCell(job.created_at, "muted"));
      return row;
    }

    function recentRow(job) {
      var verdicts = el("td", { className: "verdicts" });
      if (summaries[job.id] !== undefined) verdicts.innerHTML = summaries[job.id];
      else if (job.error) verdicts.appendChild(el("div", { className: "error", title: job.error, text: job.error }));
      else verdicts.appendChild(muted("—"));
      var row = jobCells(job, verdicts);
      row.appendChild(whenCell(job.finished_at || job.updated_at, "muted"));
      return row;
    }

    function inquiryRowSig(row) {
      return Array.prototype.map.call(row.querySelectorAll("[data-stage]"), function (cell) {
        var attempts = cell.querySelector("small");
        return cell.dataset.status + ":" + (attempts ? parseInt(attempts.textContent, 10) : 0);
      }).join(",") + "|" + row.querySelector(".quote").textContent.trim().split(" ")[0];
    }

    function inquirySig(anfrage) {
      return anfrage.stages.map(function (s) { return shown(s) + ":" + s.attempts; }).join(",") +
        "|" + (anfrage.quote_total === null ? "—" : anfrage.quote_total);
    }

    function inquiryRow(anfrage) {
      var cells = [el("td", {}, [el("a", { href: "inquiries/" + anfrage.id, text: "#" + anfrage.id + " " + anfrage.title })])];
      anfrage.stages.forEach(function (stage) {
        var cell = el("td", { className: "stage", "data-stage": stage.stage, "data-status": shown(stage) }, [badge(shown(stage))]);
        if (stage.attempts) cell.appendChild(el("small", { text: stage.attempts + " attempt" + (stage.attempts === 1 ? "" : "s") }));
        if (stage.error) cell.appendChild(el("div", { className: "error", title: stage.error, text: stage.error }));
        cells.push(cell);
      });
      cells.push(el("td", { className: "quote" }, [
        anfrage.quote_total === null ? muted("—") : anfrage.quote_total + " " + anfrage.currency
      ]));
      return el("tr", { id: "anfrage-" + anfrage.id, "data-anfrage": anfrage.id }, cells);
    }

    function inquiryInFlight(anfrage) {
      var statuses = anfrage.stages.map(shown);
      if (statuses.indexOf("running") >= 0) return true;
      return statuses.indexOf("failed") < 0 && !anfrage.complete;
    }

    function runRow(run) {
      var title = run.title || run.id;
      return el("tr", { "data-run": run.id, "data-job": run.job_id }, [
        el("td", {}, [run.job_id ? el("a", { href: "analyses/" + run.job_id, text: title }) : title]),
        el("td", {}, [badge(run.saved_by || "legacy")]),
        whenCell(run.created_at, "muted")
      ]);
    }

    /* Completed jobs get their verdict counts from the job's own endpoint, once. */
    function fetchSummaries(jobs) {
      var missing = jobs.filter(function (job) {
        return job.status === "complete" && summaries[job.id] === undefined;
      });
      return Promise.all(missing.map(function (job) {
        return call("GET", "analysis-jobs/" + job.id).then(function (reply) {
          var s = reply.data.summary;
          summaries[job.id] = s ? [s.supported + " supported", s.partial + " partial", s.unsupported + " unsupported"]
            .concat(s.missing_source ? [s.missing_source + " missing"] : []).join(" · ") : "";
        }, function () {});
      }));
    }

    function tick() {
      return Promise.all([
        call("GET", "analysis-jobs?limit=100"),
        call("GET", "anfragen?limit=20"),
        call("GET", "analysis-runs?limit=20")
      ]).then(function (replies) {
        var jobs = replies[0].data, inquiries = replies[1].data, runs = replies[2].data;
        var newestOfRun = {}, savedUpTo = {};
        jobs.forEach(function (job) {
          newestOfRun[job.run_id] = Math.max(newestOfRun[job.run_id] || 0, job.id);
        });
        runs.forEach(function (run) { if (run.job_id) savedUpTo[run.id] = run.job_id; });
        var live = jobs.filter(function (job) { return LIVE.indexOf(job.status) >= 0; });
        live.sort(function (a, b) {
          return LIVE.indexOf(b.status) - LIVE.indexOf(a.status) || a.queue_position - b.queue_position || a.id - b.id;
        });
        var recent = jobs.filter(function (job) { return TERMINAL.indexOf(job.status) >= 0; }).slice(0, 10);
        jobs.forEach(function (job) { if (TERMINAL.indexOf(job.status) >= 0) settle("job:" + job.id); });
        inquiries.forEach(function (a) { if (!inquiryInFlight(a)) settle("anfrage:" + a.id); });
        return Promise.all([
          fetchSummaries(recent),
          Promise.all(recent.map(function (job) { return saveIfNewest(job, newestOfRun, savedUpTo); }))
        ]).then(function (done) {
          var saved = done[1].some(Boolean);
          var changed = reconcile(liveJobs, live, function (j) { return "job-" + j.id; }, jobSig, liveRow);
          changed = reconcile(recentJobs, recent, function (j) { return "job-" + j.id; }, function (j) {
            return j.status + "|0";
          }, recentRow) || changed;
          changed = reconcile(inquiryRows, inquiries, function (a) { return "anfrage-" + a.id; }, inquirySig, inquiryRow) || changed;
          if (saved) return call("GET", "analysis-runs?limit=20").then(function (reply) {
            reconcile(runRows, reply.data, function (r) { return "run-" + r.id; }, function (r) {
              return r.job_id + "|" + (r.saved_by || "legacy");
            }, runRow);
            return { changed: true, live: live.length > 0 || inquiries.some(inquiryInFlight) };
          });
          changed = reconcile(runRows, runs, function (r) { return "run-" + r.id; }, function (r) {
            return r.job_id + "|" + (r.saved_by || "legacy");
          }, runRow) || changed;
          return { changed: changed, live: live.length > 0 || inquiries.some(inquiryInFlight) || recent.some(function (job) {
            return job.status === "complete" && newestOfRun[job.run_id] === job.id && (savedUpTo[job.run_id] || 0) < job.id;
          }) };
        });
      });
    }

    function showInquiry(anfrage) {
      if (document.getElementById("anfrage-" + anfrage.id)) return;
      var row = inquiryRow(anfrage);
      row.dataset.key = row.id;
      row.dataset.sig = inquirySig(anfrage);
      inquiryRows.insertBefore(row, inquiryRows.firstChild);
      var table = inquiryRows.closest("table");
      table.hidden = false;
      table.parentNode.querySelector(".empty").hidden = true;
    }

    var poller = Poller(tick);
    enhanceForms(poller, showInquiry);
    poller.start();
  }

  function enhanceForms(poller, showInquiry) {
    var analysisForm = document.getElementById("analysis-form");
    var errors = document.getElementById("form-errors");
    if (analysisForm) analysisForm.addEventListener("submit", function (event) {
      event.preventDefault();
      var data = new FormData(analysisForm);
      var source = { key: data.get("source_key"), title: data.get("source_title"), text: data.get("source_text") };
      source.doi = data.get("source_doi") || null;
      var button = analysisForm.querySelector("button[type=submit]");
      button.disabled = true;
      call("POST", "analysis-jobs", { title: data.get("title"), doc_html: data.get("doc_html"), sources: [source] }).then(
        function (reply) {
          var job = reply.data;
          errors.hidden = true;
          notify(["Analysis #" + job.id + " admitted, " + (job.status === "queued" ? "queued at position " + job.queue_position : "starting now") + "."], "job:" + job.id);
          var balance = document.getElementById("balance");
          if (balance && /^\d+$/.test(balance.textContent)) balance.textContent = String(Number(balance.textContent) - 1);
          analysisForm.reset();
          poller.nudge();
        },
        function (error) {
          errors.textContent = "";
          errors.appendChild(el("li", { text: describe(error) }));
          errors.hidden = false;
        }
      ).then(function () { button.disabled = false; });
    });

    var inquiryForm = document.getElementById("inquiry-form");
    var uploadErrors = document.getElementById("upload-errors");
    if (inquiryForm) inquiryForm.addEventListener("submit", function (event) {
      event.preventDefault();
      var data = new FormData();
      data.append("title", inquiryForm.querySelector("[name=title]").value);
      Array.prototype.forEach.call(inquiryForm.querySelector("[name=files]").files, function (file) {
        data.append("files", file);
      });
      var button = inquiryForm.querySelector("button[type=submit]");
      button.disabled = true;
      call("POST", "anfragen", data).then(
        function (reply) {
          uploadErrors.hidden = true;
          var id = reply.data.id;
          var link = el("a", { href: "inquiries/" + id, id: "new-inquiry-link", text: "Inquiry #" + id });
          notify([link, " submitted; its pipeline is running."], "anfrage:" + id);
          // On the board at once, as the API would list it now: every stage pending.
          showInquiry({
            id: id, title: data.get("title"), quote_total: null, currency: "", complete: false,
            stages: STAGES.map(function (stage) { return { stage: stage, status: "pending", attempts: 0, error: "" }; })
          });
          inquiryForm.reset();
          poller.nudge();
        },
        function (error) {
          uploadErrors.textContent = "";
          uploadErrors.appendChild(el("li", { text: describe(error) }));
          uploadErrors.hidden = false;
        }
      ).then(function () { button.disabled = false; });
    });
  }

  /* ------------------------------------------------------------ inquiry detail -- */

  function inquiry() {
    var id = body.dataset.anfrage;
    var stageRows = document.getElementById("stage-rows");
    var positionRows = document.getElementById("position-rows");
    var fileRows = document.getElementById("file-rows");
    var quote = document.getElementById("quote");
    adopt(stageRows, function (row) {
      return row.dataset.status + ":" + row.children[2].textContent.trim();
    });

    function stageRow(stage) {
      var took = "—";
      if (stage.started_at && stage.finished_at) {
        took = ((Date.parse(stage.finished_at) - Date.parse(stage.started_at)) / 1000).toFixed(2) + " s";
      }
      return el("tr", { "data-stage": stage.stage, "data-status": shown(stage) }, [
        el("td", { text: stage.stage }),
        el("td", {}, [badge(shown(stage))]),
        el("td", { className: "num", text: String(stage.attempts) }),
        whenCell(stage.started_at, "muted"),
        whenCell(stage.finished_at, "muted"),
        el("td", { className: "num", text: took }),
        el("td", {}, stage.error ? [el("div", { className: "error wrap", text: stage.error })] : [])
      ]);
    }

    function positionSig(p) { return [p.feasible, p.unit_price, p.total].map(String).join("|"); }

    function size(bytes) {
      return bytes < 1024 ? bytes + " bytes" : (bytes / 1024).toFixed(1) + " KB";
    }

    function positionRow(p) {
      var feasible = p.feasible === null ? [muted("—")] :
        p.feasible ? [badge("yes", "success")] : [badge("no", "failed"), " ", muted(p.reason)];
      var item = el("td", {}, [p.item]);
      if (p.catalog_item) item.appendChild(muted(" (" + p.catalog_item + ")"));
      return el("tr", { "data-position": p.index }, [
        el("td", { text: p.label || String(p.index) }),
        item,
        el("td", { className: "num", text: Number(p.quantity) + " " + p.unit }),
        el("td", { text: p.material_shown || "—" }),
        el("td", { className: "num", text: p.length_mm ? p.length_mm + " mm" : "—" }),
        el("td", {}, feasible),
        el("td", { className: "num", text: p.unit_price === null ? "—" : p.unit_price }),
        el("td", { className: "num", text: p.total === null ? "—" : p.total })
      ]);
    }

    function tick() {
      return call("GET", "anfragen/" + id).then(function (reply) {
        var a = reply.data;
        var changed = reconcile(stageRows, a.stages, function (s) { return "stage-" + s.stage; }, function (s) {
          return shown(s) + ":" + s.attempts;
        }, stageRow);
        changed = reconcile(positionRows, a.positions, function (p) { return "position-" + p.index; }, positionSig, positionRow) || changed;
        reconcile(fileRows, a.files, function (f) { return "file-" + f.id; }, function () { return "f"; }, function (f) {
          var link = el("a", { href: id + "/files/" + f.id, download: "", text: f.filename });
          return el("tr", {}, [el("td", {}, [link]), el("td", { text: f.format }), el("td", { className: "num", text: size(f.size) })]);
        });
        var total = a.quote_total === null ? "—" : a.quote_total + " " + a.currency;
        if (quote.textContent !== total) { quote.textContent = total; changed = true; }
        var statuses = a.stages.map(shown);
        var live = statuses.indexOf("running") >= 0 || (statuses.indexOf("failed") < 0 && !a.complete);
        if (!live) settle("anfrage:" + id);
        return { changed: changed, live: live };
      });
    }
    if (body.dataset.inFlight === "true") Poller(tick).start();
    else settle("anfrage:" + id);
  }

  /* ----------------------------------------------------------- analysis detail -- */

  function analysis() {
    var id = Number(body.dataset.job);
    var newest = body.dataset.newest === "true";
    var status = document.getElementById("status");
    var position = document.getElementById("position");
    var runState = document.getElementById("run-state");
    var verdictRows = document.getElementById("verdict-rows");
    var summary = document.getElementById("summary");
    var error = document.getElementById("job-error");

    function save(job) {
      if (job.status !== "complete" || !newest || runState.dataset.saved === "true" || saving[id]) return Promise.resolve();
      saving[id] = true;
      return call("POST", "analysis-runs", { job_id: id }).then(function (reply) {
        runState.dataset.saved = "true";
        runState.textContent = "";
        runState.appendChild(document.createTextNode("Saved by "));
        runState.appendChild(badge(reply.data.saved_by || "legacy"));
        runState.appendChild(document.createTextNode("."));
      }, function () { saving[id] = false; });
    }

    function tick() {
      return call("GET", "analysis-jobs/" + id).then(function (reply) {
        var job = reply.data;
        var changed = status.dataset.status !== job.status;
        status.dataset.status = job.status;
        status.className = "badge status " + job.status;
        status.textContent = job.status;
        position.hidden = !job.queue_position;
        position.querySelector("strong").textContent = String(job.queue_position);
        setWhen(document.getElementById("started"), job.started_at);
        setWhen(document.getElementById("finished"), job.finished_at);
        error.textContent = job.error;
        error.hidden = !job.error;
        if (job.summary) {
          var s = job.summary;
          summary.textContent = [s.supported + " supported", s.partial + " partial", s.unsupported + " unsupported"]
            .concat(s.missing_source ? [s.missing_source + " missing source"] : []).join(" · ");
          summary.hidden = false;
        }
        reconcile(verdictRows, job.verdicts || [], function (v) { return "verdict-" + v.marker; }, function (v) {
          return v.verdict + "|" + v.score;
        }, function (v) {
          return el("tr", {}, [
            el("td", { text: v.marker }), el("td", { text: v.source_key }), el("td", { text: v.claim }),
            el("td", {}, [badge(v.verdict, "verdict")]), el("td", { className: "num", text: v.score.toFixed(2) })
          ]);
        });
        if (TERMINAL.indexOf(job.status) >= 0) settle("job:" + id);
        return save(job).then(function () {
          return { changed: changed, live: LIVE.indexOf(job.status) >= 0 };
        });
      });
    }
    if (body.dataset.inFlight === "true" || (newest && runState.dataset.saved !== "true")) Poller(tick).start();
    if (body.dataset.inFlight !== "true") settle("job:" + id);
  }

  var pages = { dashboard: dashboard, inquiry: inquiry, analysis: analysis };
  if (pages[body.dataset.page]) pages[body.dataset.page]();
  watchWorkers();
})();
