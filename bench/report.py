"""The run's outputs: the table on stdout, ``bench/results/*.json``, ``docs/benchmarks.md``."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import Row
from queueing.display import format_table

ROOT = Path(__file__).resolve().parent.parent
HEADER = ["scenario", "today", "baseline", "ratio", "target", "met"]


def number(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "x":
        return f"{value:.2f}x"
    if unit.endswith("/s") or unit == "MB":
        return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"
    if unit == "ms":
        if value >= 100:
            return f"{value:,.0f}"
        return f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    return f"{value:,.1f}"


def _with_unit(value: float | None, unit: str) -> str:
    text = number(value, unit)
    return text if unit == "x" or value is None else f"{text} {unit}"


def _met(row: Row) -> str:
    if row.error:
        return "error"
    return {True: "yes", False: "no", None: "—"}[row.met]


def table_rows(rows: Sequence[Row]) -> list[list[str]]:
    out = []
    for row in rows:
        baseline = (
            f"{row.baseline_label}: {_with_unit(row.baseline.median, row.unit)}"
            if row.baseline
            else ""
        )
        out.append(
            [
                row.scenario,
                _with_unit(row.figure, row.unit) if not row.error else "error",
                baseline,
                f"{row.ratio:.2f}" if row.ratio is not None else "",
                row.target.text(row.unit) if row.target else "",
                _met(row),
            ]
        )
    return out


def text_table(rows: Sequence[Row]) -> str:
    return format_table(HEADER, table_rows(rows))


# --- run facts ----------------------------------------------------------------------


def git() -> dict[str, Any]:
    def run(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    return {
        "commit": run("rev-parse", "HEAD"),
        "branch": run("rev-parse", "--abbrev-ref", "HEAD"),
        "dirty": bool(run("status", "--porcelain", "--untracked-files=no")),
    }


def speed_text(host: dict[str, Any]) -> str:
    """The host-speed probes' sentence (``bench.speed``); empty for a run without them."""
    from bench import speed

    return speed.text(host["speed"]) if host.get("speed") else ""


def machine() -> dict[str, Any]:
    cpu = ""
    memory_mb = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory_mb = int(line.split()[1]) // 1024
                break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "memory_mb": memory_mb,
        "load_average": list(os.getloadavg()),
    }


# --- JSON ---------------------------------------------------------------------------


def write_json(path: Path, document: dict[str, Any], rows: Sequence[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {**document, "scenarios": [row.as_dict() for row in rows]}
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False, default=str) + "\n")


# --- docs/benchmarks.md -------------------------------------------------------------


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _range(row: Row) -> str:
    if row.result is None or len(row.result.samples) < 2:
        return ""
    return f"{number(row.result.low, row.unit)}-{number(row.result.high, row.unit)}"


def markdown(document: dict[str, Any], rows: Sequence[Row]) -> str:
    run = document
    git_facts, host, server = run["git"], run["machine"], run["server"]
    load = ", ".join(f"{x:.1f}" for x in host["load_average"])
    lines = [
        "# Benchmarks",
        "",
        "<!-- Written by `make bench` (bench/report.py): edit the harness, not this page. -->",
        "",
        "pgstage side by side with plain procrastinate, in one run (`make bench`): each "
        "scenario measures "
        "pgstage and, where one exists, a baseline that does nothing but what the scenario "
        "needs of both sides (a plain procrastinate task whose body does nothing; for the "
        "stage job, a no-op that defers its next hop). Both sides alternate — plain, "
        "pgstage, plain, pgstage, … — and each figure is the median of "
        f"{run['sizes']['repetitions']} repetition(s) (min-max beside it). Worker start-up is "
        "never measured: jobs are timed from procrastinate's events, the first job's start "
        "to the last job's end. The workers of both sides log warnings only (no line per "
        "job). No figure here is a test; nothing asserts a time.",
        "",
        f"Measured {run['started_at']} in `{run['sizes']['mode']}` mode, commit "
        f"`{git_facts['commit'][:12]}`{' (with local changes)' if git_facts['dirty'] else ''}"
        f"; PostgreSQL {server['version']}"
        + "".join(f", {k} {v}" for k, v in server.get("settings", {}).items())
        + f"; {host['cpus']} CPU(s) ({host['cpu'] or 'unknown'}),"
        f" {host['memory_mb']} MB; load average at the start {load}; the run took "
        f"{run['duration_s'] / 60:.1f} min ("
        + ", ".join(f"{g} {s / 60:.1f}" for g, s in run.get("groups_seconds", {}).items())
        + ").",
    ]
    if host.get("speed"):
        lines += ["", speed_text(host)]
    if run.get("note"):
        lines += ["", f"**Note:** {run['note']}"]
    lines += [
        "",
        "| scenario | today | min-max | baseline | ratio | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for row, cells in zip(rows, table_rows(rows), strict=True):
        scenario, today, baseline, ratio, target, met = cells
        lines.append(
            f"| {_md(scenario)} | {today} | {_range(row)} | {_md(baseline)} | {ratio} | "
            f"{_md(target)} | {met} |"
        )
    lines += [
        "",
        "## How to reproduce",
        "",
        "```",
        "make bench                                 # every scenario; writes this page",
        "DATABASE_URL=postgresql://… make bench     # on a server of your choice",
        ".venv/bin/python -m bench --quick          # smaller sizes, fewer repetitions",
        ".venv/bin/python -m bench --only jobs      # one group: enqueue, admission,",
        "                                           #   resume, jobs, sustained, scale",
        "```",
        "",
        "Without `DATABASE_URL` the harness uses a database `pgstage_bench` on the embedded "
        "server (`.data/`), so it never touches the demo's data; with `DATABASE_URL`, give it "
        "a database nobody else uses (its workers take every job of the `default` queue). "
        "It migrates that database, creates its own tenants (`bench-…`) and queues "
        "(`bench…`) and removes them afterwards. `--sweep-rows N` sets the large size of the "
        "sweep and metrics scenarios (default 1,000,000; `--quick`: 100,000); "
        "`--repetitions N` overrides the mode's; `--sustained-seconds N` how long the "
        "sustained-load scenario holds each offered rate (default 60; `--quick`: 10); "
        "`--json` and `--doc` choose the outputs "
        "(a full run writes `bench/results/latest.json` and this page, `--quick` "
        "`bench/results/quick.json` only). Every figure, its samples, parameters, profile, "
        "the machine and the commit are in the JSON.",
        "",
        f"Statement counts: {server['statements_note']}.",
        "",
        "## What each scenario measures",
        "",
    ]
    for row in rows:
        params = ", ".join(f"{k}={v}" for k, v in row.parameters.items())
        lines.append(
            f"- **{_md(row.scenario)}** — {row.measures}." + (f" ({params})" if params else "")
        )
    misses = [row for row in rows if row.met is False or row.error]
    lines += ["", "## Not met, and why", ""]
    if not misses:
        lines.append("Every target is met.")
    for row in misses:
        if row.error:
            lines.append(f"- **{_md(row.scenario)}**: could not be measured — {row.error}")
            continue
        gap = row.target.gap(figure=row.figure, ratio=row.ratio)
        if row.target.on == "ratio":
            measured = f"ratio {row.ratio:.2f}"
        else:
            measured = _with_unit(row.figure, row.unit)
        lines.append(
            f"- **{_md(row.scenario)}**: {measured}, target {row.target.text(row.unit)} "
            f"({gap}). {row.cause or 'No profile explains it yet.'}"
        )
    reported = [row for row in rows if row.target is None and row.cause and not row.error]
    if reported:
        lines += ["", "## Without a target, and why", ""]
        for row in reported:
            lines.append(f"- **{_md(row.scenario)}**: {row.cause}")
    lines += _statements_section(rows)
    lines += _waits_section(rows)
    lines += CAVEATS
    lines += [
        "",
        "## Other benchmarks",
        "",
        "`python -m bench.writes_per_job` counts `analysis_runs` tuple writes per finished "
        "job ([invariant 6](design.md#invariants)) for the backstop design against the eager "
        "one it replaced; see [runs](runs.md).",
        "",
    ]
    return "\n".join(lines)


CAVEATS = [
    "",
    "## Caveats",
    "",
    "- The baseline workers run procrastinate's own `Worker` (`bench/plain_settings.py`), "
    "pgstage's run pgstage's (`queueing.worker`); both load the same Django project, so "
    "their memory differs only by what each worker does.",
    "- `bench.stage` runs the stage protocol with the framework's pieces "
    "(`queueing.app.task`, `Ledger.claim`/`complete`, `queueing.enqueue`) as "
    "`pipeline_stage_run` does, without an inquiry's work; when the stage path changes "
    "(say, one statement for complete + enqueue), `bench/tasks.py` follows it. The "
    "inquiry scenarios run the real pipeline.",
    "- Enqueue, admission, the sweeps and `/metrics` run in the harness's own process; "
    "admission's threads share one Python interpreter (and its lock), on both sides. On a "
    "machine whose CPUs are already busy, threads add no throughput to either side and "
    "the 8-versus-1 figures say little.",
    "- Round trips count every connection of a worker, procrastinate's pool included: it "
    "checks each connection it lends (an empty statement) and wraps each of its statements "
    "in `BEGIN` … `COMMIT`, so a no-op job already costs about 12.",
    "- Lock waits are samples every 20 ms (shares of samples, not durations).",
    "- The sweep and `/metrics` scenarios bulk-insert rows with short bodies; what counts "
    'as "saved" is spelled out in `bench/sql/bench.sql` and must follow the schema (the '
    "scenario refuses to time a sweep that finds work).",
    "- Absolute figures belong to the machine; ratios carry across machines only when the "
    "machine is quiet (the load average is recorded above and in the JSON). The host-speed "
    "probes at the start and the end of the run (above) show how fast the machine was: an "
    "absolute target (the resume sweep's milliseconds) reads against them, and a probe that "
    "moved by more than a quarter during the run flags it.",
]


def _statements_section(rows: Sequence[Row]) -> list[str]:
    lines = ["", "## Round trips and statements", ""]
    lines.append(
        "Counted on the wire (`bench.wire`): a round trip is a request the client waits for, "
        "a statement is one executed statement (`BEGIN`, `COMMIT`, savepoints and health "
        "checks included), a transaction ends when the server reports the session idle after "
        "a statement (an autocommit statement counts as one). Per unit of work, the most "
        "frequent statements (literals as `?`):"
    )
    for row in rows:
        for side, counts in row.profile.get("counts", {}).items():
            kinds = ", ".join(
                f"{n:.1f} {kind}" for kind, n in counts.get("statements_by_kind", {}).items()
            )
            lines += [
                "",
                f"**{_md(row.scenario)}** — {side}: {counts['round_trips']:.1f} round trips, "
                f"{counts['statements']:.1f} statements ({kinds}), "
                f"{counts['transactions']:.1f} transactions, {counts['commits']:.1f} COMMIT",
                "",
                "| calls | statement |",
                "|---|---|",
            ]
            for statement in counts["top_statements"][:8]:
                lines.append(
                    f"| {statement['calls_per_unit']:g} | `{_md(statement['statement'][:150])}` |"
                )
            if "pg_stat_statements" in counts:
                stats = counts["pg_stat_statements"]
                lines.append(
                    f"\npg_stat_statements: {stats['statements']:.1f} statements (no empty "
                    f"ones), and {stats['foreign_key_checks']:.1f} foreign-key checks run by "
                    "triggers, which it counts as top-level statements."
                )
    return lines


def _waits_section(rows: Sequence[Row]) -> list[str]:
    lines = []
    for row in rows:
        waits = row.profile.get("waits")
        if not waits or not waits.get("share_by_state"):
            continue
        if not lines:
            lines = [
                "",
                "## What the sessions wait on",
                "",
                "`pg_stat_activity` sampled every 20 ms during the run (shares of session "
                "samples; `running` is executing, `client: idle in transaction` is a "
                "transaction held open while Python works):",
            ]
        shares = ", ".join(
            f"{state} {share:.0%}" for state, share in waits["share_by_state"].items()
        )
        lines += ["", f"**{_md(row.scenario)}** (pgstage): {shares}."]
        for statement in waits.get("waiting_statements", [])[:3]:
            text = _md(statement["statement"][:140])
            lines.append(f"- {statement['wait']} {statement['share']:.0%}: `{text}`")
    return lines
