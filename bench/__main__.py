"""``python -m bench``: every scenario, side by side with plain procrastinate, as a table.

Writes ``bench/results/latest.json`` and ``docs/benchmarks.md`` (a full run), or
``bench/results/quick.json`` (``--quick``), or what ``--json``/``--doc`` name. Without
``DATABASE_URL`` it runs on a database ``pgstage_bench`` of the embedded server.
Exit status 1 when a scenario could not be measured; a missed target is not an error.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from bench.harness import MODES, Row, Sizes, said

if TYPE_CHECKING:
    from bench.database import Server
    from bench.scenarios.common import Context

ROOT = Path(__file__).resolve().parent.parent
BENCH_DATABASE = "pgstage_bench"
#: The groups of scenarios, in the order they run (the bulk-insert one last).
GROUPS = ("enqueue", "admission", "resume", "jobs", "sustained", "scale")
#: The provider budget must not refuse the harness's admits (thousands a run).
CORE_DAILY_BUDGET = "1000000000"
INQUIRIES_PER_HOUR = "1000000"
APPLICATION = "pgstage-bench-harness"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions")
    mode.add_argument(
        "--smoke", action="store_true", help="tiny sizes, one repetition (proves it runs)"
    )
    parser.add_argument("--repetitions", type=int, help="repetitions per side (default: mode's)")
    parser.add_argument(
        "--sweep-rows", type=int, help="large size of the sweep and metrics scenarios"
    )
    parser.add_argument(
        "--sustained-seconds",
        type=float,
        help="how long the sustained-load scenario holds each rate (default: mode's; full: 60)",
    )
    parser.add_argument("--only", help=f"comma-separated groups to run, of: {', '.join(GROUPS)}")
    parser.add_argument("--json", type=Path, help="where to write the results")
    parser.add_argument("--doc", type=Path, help="where to write the Markdown page")
    parser.add_argument("--no-doc", action="store_true", help="write no Markdown page")
    parser.add_argument("--note", default="", help="a sentence for the page (e.g. the machine)")
    args = parser.parse_args(argv)
    if args.repetitions is not None and args.repetitions < 1:
        parser.error("--repetitions must be at least 1")
    if args.sustained_seconds is not None and args.sustained_seconds <= 0:
        parser.error("--sustained-seconds must be more than 0")
    if args.only:
        unknown = set(args.only.split(",")) - set(GROUPS)
        if unknown:
            parser.error(f"unknown group(s): {', '.join(sorted(unknown))}")
    return args


def _embedded_bench_url() -> str:
    """The embedded server's URL, for a database of the harness's own."""
    import psycopg
    from psycopg import sql

    from config.embedded import embedded_database_url

    data_dir = Path(os.environ.get("PGSTAGE_DATA_DIR") or ROOT / ".data")
    url = embedded_database_url(data_dir / "pg")
    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DATABASE]
        ).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(BENCH_DATABASE)))
    return urlunsplit(urlsplit(url)._replace(path="/" + BENCH_DATABASE))


def _environment(storage: Path) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    if not os.environ.get("DATABASE_URL", "").strip():
        os.environ["DATABASE_URL"] = _embedded_bench_url()
    os.environ["STORAGE_ROOT"] = str(storage)
    os.environ["CORE_DAILY_BUDGET"] = CORE_DAILY_BUDGET
    # The tenant's hourly bound on inquiries stays switched on (its check is part of the
    # path measured), set far above what the scenarios submit.
    os.environ["MAX_INQUIRIES_PER_TENANT_PER_HOUR"] = INQUIRIES_PER_HOUR
    os.environ["PGAPPNAME"] = APPLICATION
    os.environ.setdefault("LOG_LEVEL", "WARNING")


def _outputs(args: argparse.Namespace, mode: str) -> tuple[Path | None, Path | None]:
    default_json = {"full": "latest.json", "quick": "quick.json", "smoke": "smoke.json"}[mode]
    json_path = args.json or ROOT / "bench" / "results" / default_json
    doc_path = args.doc or (ROOT / "docs" / "benchmarks.md" if mode == "full" else None)
    return json_path, None if args.no_doc else doc_path


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _sizes(args: argparse.Namespace) -> Sizes:
    sizes = MODES["smoke" if args.smoke else "quick" if args.quick else "full"]
    if args.repetitions:
        sizes = replace(sizes, repetitions=args.repetitions)
    if args.sweep_rows:
        sizes = replace(sizes, sweep_large=args.sweep_rows)
    if args.sustained_seconds:
        sizes = replace(sizes, sustained_seconds=args.sustained_seconds)
    return sizes


def _document(
    args: argparse.Namespace, sizes: Sizes, params: dict[str, Any], server: Server
) -> dict[str, Any]:
    """What the JSON and the page say about the run besides its rows."""
    from bench import report

    return {
        "format": 1,
        "started_at": datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat(),
        "git": report.git(),
        "machine": report.machine(),
        "server": {
            "version": server.version,
            "database": params["dbname"],
            "max_connections": server.max_connections,
            "shared_preload_libraries": server.shared_preload_libraries,
            "pg_stat_statements": server.statements,
            "statements_note": server.statements_note,
            "settings": server.settings,
        },
        "sizes": sizes.__dict__,
        "note": args.note,
        "groups_seconds": {},
    }


def _run_groups(
    ctx: Context, groups: list[str], seconds: dict[str, float]
) -> tuple[list[Row], bool]:
    """Every group's rows; a group that fails leaves one row with its error."""
    from bench.scenarios import admission, enqueueing, jobs, resume, scale, sustained

    modules = {
        "enqueue": enqueueing,
        "admission": admission,
        "resume": resume,
        "jobs": jobs,
        "sustained": sustained,
        "scale": scale,
    }
    rows, failed = [], False
    for group in groups:
        started = time.monotonic()
        try:
            rows += modules[group].run(ctx)
        except Exception as exc:
            failed = True
            said()
            traceback.print_exc()
            rows.append(
                Row(
                    key=f"{group}_error",
                    scenario=f"{group} scenarios",
                    unit="",
                    measures="",
                    error=f"{type(exc).__name__}: {_first_line(exc)}",
                )
            )
        seconds[group] = round(time.monotonic() - started, 1)
    return rows, failed


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    storage = Path(tempfile.mkdtemp(prefix="pgstage-bench-storage-"))
    log_dir = Path(tempfile.mkdtemp(prefix="pgstage-bench-logs-"))
    _environment(storage)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from bench import database, report, speed
    from bench.scenarios.common import Context
    from bench.tasks import BenchStep

    sizes = _sizes(args)
    json_path, doc_path = _outputs(args, sizes.mode)
    try:
        connection.ensure_connection()
    except django.db.OperationalError as exc:
        name = connection.settings_dict["NAME"]
        reason = str(exc).strip().splitlines()[-1]
        print(
            f"python -m bench: cannot reach the database {name!r} ({reason}). Create it "
            f"(createdb {name}), or unset DATABASE_URL to run on the embedded PostgreSQL.",
            file=sys.stderr,
        )
        return 2
    call_command("migrate", verbosity=0)
    with connection.schema_editor() as editor:
        if "bench_steps" in connection.introspection.table_names():
            editor.delete_model(BenchStep)
        editor.create_model(BenchStep)
    database.purge_leftovers()
    first_job_id = database.last_job_id()
    params = database.server_params()
    server = database.server()
    ctx = Context(
        sizes=sizes,
        params=params,
        database_url=database.database_url(),
        server=server,
        log_dir=log_dir,
        application=APPLICATION,
    )
    document = _document(args, sizes, params, server)
    document["machine"]["speed"] = {"start": speed.probe()}
    started = time.monotonic()
    try:
        rows, failed = _run_groups(
            ctx, args.only.split(",") if args.only else list(GROUPS), document["groups_seconds"]
        )
    finally:
        said()
        database.purge_leftovers()
        database.execute("delete_ticks_since", after=first_job_id)
        with connection.schema_editor() as editor:
            editor.delete_model(BenchStep)
        shutil.rmtree(storage, ignore_errors=True)
    document["duration_s"] = round(time.monotonic() - started, 1)
    document["machine"]["load_average_end"] = list(os.getloadavg())
    document["machine"]["speed"]["end"] = speed.probe()
    print(report.text_table(rows))
    print("\n" + report.speed_text(document["machine"]))
    report.write_json(json_path, document, rows)
    print(f"\nresults: {json_path}")
    if doc_path is not None:
        doc_path.write_text(report.markdown(document, rows))
        print(f"page: {doc_path}")
    if failed:
        print(f"worker logs: {log_dir}", file=sys.stderr)
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
