"""Admission (``runs.admission.analysis_job_admit``) against plain defers.

* throughput: T threads released together, N admits in all, each for a user drawn (seeded)
  from U funded users; timed from the release to the last thread's last return. The
  baseline: T threads, N plain ``defer()`` of the no-op. Also with one thread (N/2 calls),
  for the scaling.
* the storm: S threads released together, each admitting once for the same user, each call
  timed on its own thread; p99 (nearest rank) over every call of the repetition's storms.
  The baseline: S threads, one plain defer each; and, to show what serialising alone
  costs, the same defers each under one advisory lock (BEGIN, the lock, the defer, COMMIT
  in one round trip, as an admit sends its own). Each thread's session has made one call
  of its side before the release (an admit for a user of its own; a defer), as a web
  thread's persistent connection (``CONN_MAX_AGE``) has: a session's first statement of a
  kind is parsed and planned, or its SQL function compiled, afresh.
* round trips: admits through a counting proxy (``bench.wire``): for a user whose slot is
  free (born ``pending``, its ``process_job`` enqueued) and for a user with an active job
  (born ``queued``); a plain defer the same way.

Every repetition admits for fresh users of a fresh tenant (removed after it), so queues
start empty. Sessions are opened before the release; ``pg_stat_activity`` is sampled
meanwhile (``bench.waits``; in the storms from the release on, not over the warm-up calls)
to show what admits wait on.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from bench import database
from bench.harness import Row, Series, Target, percentile, say, series, timed
from bench.scenarios.common import (
    Context,
    admit,
    bench_tenant,
    counts_text,
    funded_users,
    released_together,
    through,
    top_work,
)
from bench.tasks import noop
from bench.waits import WaitSampler
from bench.wire import Counts, WireCounter
from bench.workers import BenchError
from queueing import locks, sql
from queueing.serial import SerialQueue

QUEUE = "bench_admit"


def _defer(unit: object) -> None:
    noop.configure(queue=QUEUE).defer(unit=str(unit))


class _Waits:
    """Lock waits sampled over a scenario's repetitions, per side."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.summaries: dict[str, list[dict[str, Any]]] = {"pgstage": [], "plain": []}

    def sampler(self, *, armed: bool = True) -> WaitSampler:
        return WaitSampler(self.ctx.params, application=self.ctx.application, armed=armed)

    def add(self, side: str, sampler: WaitSampler) -> None:
        self.summaries[side].append(sampler.summary())

    def merged(self, side: str) -> dict[str, Any]:
        """The repetitions' summaries in one (shares averaged, statements of the first)."""
        runs = self.summaries[side]
        if not runs:
            return {}
        states: dict[str, float] = {}
        for run in runs:
            for state, share in run["share_by_state"].items():
                states[state] = states.get(state, 0.0) + share / len(runs)
        return {
            "samples": sum(r["samples"] for r in runs),
            "active_sessions_mean": round(
                sum(r["active_sessions_mean"] for r in runs) / len(runs), 2
            ),
            "share_by_state": dict(sorted(states.items(), key=lambda kv: -kv[1])),
            "waiting_statements": max(runs, key=lambda r: r["samples"])["waiting_statements"],
        }


def _admit_rate(ctx: Context, waits: _Waits, *, threads: int, total: int, seed: int) -> float:
    tenant = bench_tenant("admit")
    try:
        users = funded_users(tenant, ctx.sizes.admit_users, credits=total)
        rng = random.Random(seed)
        picks = [users[rng.randrange(len(users))] for _ in range(total)]
        with waits.sampler() as sampler:
            released = released_together(admit, [picks[t::threads] for t in range(threads)])
        waits.add("pgstage", sampler)
    finally:
        database.purge_tenant(tenant.pk)
    return total / released.wall


def _defer_rate(waits: _Waits, *, threads: int, total: int) -> float:
    with waits.sampler() as sampler:
        released = released_together(
            _defer, [list(range(t, total, threads)) for t in range(threads)]
        )
    waits.add("plain", sampler)
    database.delete_bench_jobs()
    return total / released.wall


def _storm_admits(ctx: Context, waits: _Waits) -> list[float]:
    size, storms = ctx.sizes.storm, ctx.sizes.storms
    tenant = bench_tenant("storm")
    # A tenant per thread for the warm-up admits, so they wait on no budget row.
    warm_tenants = [bench_tenant(f"storm-warm{t}") for t in range(size)]
    latencies: list[float] = []
    try:
        warm_users = [funded_users(t, storms, credits=1) for t in warm_tenants]
        for storm, user in enumerate(funded_users(tenant, storms, credits=size)):
            with waits.sampler(armed=False) as sampler:
                released = released_together(
                    lambda _i, user=user: admit(user),
                    [[0]] * size,
                    warm_up=lambda t, storm=storm: admit(warm_users[t][storm]),
                    on_release=sampler.arm,
                )
            waits.add("pgstage", sampler)
            latencies += released.latencies
    finally:
        for purged in (tenant, *warm_tenants):
            database.purge_tenant(purged.pk)
    return latencies


def _storm_defers(ctx: Context, waits: _Waits) -> list[float]:
    latencies: list[float] = []
    for _ in range(ctx.sizes.storms):
        with waits.sampler(armed=False) as sampler:
            released = released_together(
                _defer,
                [[i] for i in range(ctx.sizes.storm)],
                warm_up=lambda i: _defer(-1 - i),
                on_release=sampler.arm,
            )
        waits.add("plain", sampler)
        latencies += released.latencies
    database.delete_bench_jobs()
    return latencies


#: The plain defer's own SQL (procrastinate's ``defer``), under one advisory lock.
_SERIAL_DEFER = (
    "SELECT unnest(procrastinate_defer_jobs_v1(ARRAY[ROW(%(queue)s, %(task)s, 0, NULL, NULL, "
    "%(args)s::jsonb, NULL)]::procrastinate_job_to_defer_v1[]))"
)


#: The storm's one lock, as a user's admits take theirs (``queueing.locks``).
_STORM_LOCK = locks.xact_lock_statement(locks.namespace("bench_storm"), "one-user")


def _serial_defer(unit: object) -> None:
    """A plain defer serialised as one user's admits are: ``BEGIN``, one advisory lock for
    every caller, the defer, ``COMMIT``, in one round trip (as the admit sends its own)."""
    raw = connection.connection
    with sql.committed(raw):
        cursor = raw.cursor()
        cursor.execute(*_STORM_LOCK)
        cursor.execute(
            _SERIAL_DEFER,
            {"queue": QUEUE, "task": noop.name, "args": json.dumps({"unit": str(unit)})},
        )


def _storm_serial_defers(ctx: Context, waits: _Waits) -> list[float]:
    """The storm's floor of serialisation: the baseline's defers, one after the other
    under one lock (:func:`_serial_defer`); only the admit's own work differs from it."""
    latencies: list[float] = []
    for _ in range(ctx.sizes.storms):
        released = released_together(
            _serial_defer,
            [[i] for i in range(ctx.sizes.storm)],
            warm_up=lambda i: _serial_defer(-1 - i),
        )
        latencies += released.latencies
    database.delete_bench_jobs()
    return latencies


def _floor(ctx: Context) -> dict[str, float]:
    """Where one admit's time goes, one thread, nothing contended (medians in ms over
    ``storm`` admits, each for a fresh user): the whole call (``admit``); the admit's
    round trip under the user's lock (``round_trip``: binding the parameters, then BEGIN,
    lock, statement and COMMIT, the WAL flush included, in one pipeline); the statement's
    run on the server (``statement``: the execution time EXPLAIN ANALYZE reports, timing
    off, after the user's lock, in a transaction then rolled back); the server's parsing
    and planning of the statement (``planning``: its EXPLAIN, without running it, less a
    bare round trip: what each admit pays when the statement is not prepared;
    ``prepared``: 1 when it is); a bare round trip (``network``: ``SELECT 1``) and a plain
    defer (``defer``); the harness's CPU time for one admit and for one defer
    (``admit_cpu``, ``defer_cpu``: the process's, nothing else running in it); the
    thread's CPU time within the round trip and within the bare one (``round_trip_cpu``,
    ``network_cpu``: psycopg building the pipeline and reading its results). Derived:
    ``wire`` (a bare round trip's wait: network - network_cpu), ``server`` (the round
    trip's wait less ``wire``: the server's time for the pipeline, BEGIN and the lock's
    statement before the lock, then under it the statement (and its planning when not
    prepared), the COMMIT, its deferred checks and its WAL flush; an estimate, which
    also holds any wait for a CPU), ``client`` (admit - server - wire: the admit's own
    time in Python and psycopg), ``under_lock`` (= server, an upper estimate),
    ``commit`` (server - statement) and ``budget_row`` (= server: the tenant's budget row
    is held for part of it, from its UPSERT in the statement to the end of the
    COMMIT's flush). Where the server's process can be read (``/proc``: a local server),
    the CPU it spends per admit and per plain defer (``server_cpu``,
    ``defer_server_cpu``: mean over ``storm`` calls each, on this thread's connection)."""
    k = ctx.sizes.storm
    names = (
        "admit",
        "round_trip",
        "statement",
        "network",
        "defer",
        "planning",
        "admit_cpu",
        "defer_cpu",
        "round_trip_cpu",
        "network_cpu",
    )
    samples: dict[str, list[float]] = {name: [] for name in names}
    original = SerialQueue._run_pipelined

    sent: list[tuple[Any, ...]] = []

    def timed_pipeline(queue: SerialQueue, *args: Any) -> Any:
        sent[:] = [args]
        started, cpu_started = time.perf_counter(), time.thread_time()
        try:
            return original(queue, *args)
        finally:
            samples["round_trip"].append(time.perf_counter() - started)
            samples["round_trip_cpu"].append(time.thread_time() - cpu_started)

    def select_one() -> None:
        cpu_started = time.thread_time()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        samples["network_cpu"].append(time.thread_time() - cpu_started)

    def cpu(func) -> float:
        started = time.process_time()
        func()
        return time.process_time() - started

    tenant = bench_tenant("floor")
    try:
        users = funded_users(tenant, 3 * k, credits=1)
        server_cpu = _server_cpu_per_call(
            [lambda user=user: admit(user) for user in users[2 * k :]]
        )
        defer_server_cpu = _server_cpu_per_call([lambda: _defer("floor")] * k)
        SerialQueue._run_pipelined = timed_pipeline  # type: ignore[method-assign]
        for user, other in zip(users[:k], users[k : 2 * k], strict=True):
            samples["admit"].append(timed(lambda user=user: admit(user)))
            samples["admit_cpu"].append(cpu(lambda other=other: admit(other)))
            samples["network"].append(timed(select_one))
            samples["defer"].append(timed(lambda: _defer("floor")))
            samples["defer_cpu"].append(cpu(lambda: _defer("floor")))
        lock, statement, params = sent[0]
        for _ in range(k):
            samples["planning"].append(timed(lambda: _explained(statement, params)))
            samples["statement"].append(_executed(lock, statement, params))
    finally:
        SerialQueue._run_pipelined = original  # type: ignore[method-assign]
        database.purge_tenant(tenant.pk)
        database.delete_bench_jobs()
    ms = {name: Series(tuple(v)).median * 1000 for name, v in samples.items()}
    ms["planning"] -= ms["network"]
    ms["prepared"] = float(sql.prepares(connection))
    wait = ms["round_trip"] - ms["round_trip_cpu"]
    ms["wire"] = ms["network"] - ms["network_cpu"]
    # Not clamped: a reading below the statement's own time is shown as it is.
    ms["server"] = wait - ms["wire"]
    ms["client"] = ms["admit"] - ms["server"] - ms["wire"]
    ms["under_lock"] = ms["server"]
    ms["commit"] = ms["server"] - ms["statement"]
    ms["budget_row"] = ms["server"]
    if server_cpu is not None and defer_server_cpu is not None:
        ms["server_cpu"] = server_cpu * 1000
        ms["defer_server_cpu"] = defer_server_cpu * 1000
    return {name: round(value, 3) for name, value in ms.items()}


def _backend_cpu_seconds(pid: int) -> float | None:
    """The CPU time of server process ``pid`` (``/proc/PID/schedstat``, nanoseconds: the
    server runs on this machine), or None where it cannot be read (a remote server)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _server_cpu_per_call(calls: list[Any]) -> float | None:
    """The CPU the server's process for this thread's connection spends per call, in
    seconds (each call runs on that connection); None when it cannot be read."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    before = _backend_cpu_seconds(pid)
    if before is None or not calls:
        return None
    for call in calls:
        call()
    after = _backend_cpu_seconds(pid)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (same,) = cursor.fetchone()
    if after is None or same != pid:
        return None
    return (after - before) / len(calls)


def _executed(lock: tuple[str, dict[str, Any]], statement: str, params: dict[str, Any]) -> float:
    """The statement's execution time on the server in seconds (EXPLAIN ANALYZE, timing
    off), its lock taken first, in a transaction rolled back."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(*lock)
        cursor.execute("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + statement, params)
        (plan,) = cursor.fetchone()
        transaction.set_rollback(True)
    document = json.loads(plan) if isinstance(plan, str) else plan
    return float(document[0]["Execution Time"]) / 1000


def _explained(statement: str, params: dict[str, Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + statement, params)
        cursor.fetchall()


def _counted(ctx: Context) -> dict[str, tuple[Counts, int]]:
    """Wire counts (and Django's captured statements) of k admits per case, and k defers."""
    k = ctx.sizes.counted_admits
    tenant = bench_tenant("count")
    totals: dict[str, tuple[Counts, int]] = {}
    try:
        users = funded_users(tenant, k, credits=2)
        with WireCounter(ctx.params) as counter:

            def measure(name: str, call) -> None:
                before = counter.snapshot()
                with CaptureQueriesContext(connection) as captured:
                    call()
                counts, django = totals.get(name, (Counts(), 0))
                totals[name] = (counts + (counter.snapshot() - before), django + len(captured))

            def body() -> None:
                for user in users:
                    measure("free", lambda user=user: admit(user))
                    measure("queued", lambda user=user: admit(user))
                    measure("defer", lambda: _defer("counted"))

            through(counter, body)
    finally:
        database.purge_tenant(tenant.pk)
        database.delete_bench_jobs()
    return totals


def _long_ledger(ctx: Context) -> dict[str, float]:
    """One admit's time (median ms, one thread, nothing contended) for a user with
    ``ledger_entries`` credit ledger entries (``long``) and for a fresh user (``fresh``),
    in turns: the same admits (each user's first is born pending, the rest queued
    behind it), so only the ledger differs. The long one's entries are grants written
    in one SQL statement just before the timing: its first admit sums them once and
    folds them into the user's balance mark (``first``: as after an upgrade, a history
    no admission had folded yet); the later ones read the mark and the entries since."""
    k = ctx.sizes.storm
    tenant = bench_tenant("ledger")
    samples: dict[str, list[float]] = {"long": [], "fresh": []}
    try:
        long_user, fresh_user = funded_users(tenant, 2, credits=k)
        database.execute("ledger_entries", user=long_user.pk, entries=ctx.sizes.ledger_entries)
        for _ in range(k):
            samples["long"].append(timed(lambda: admit(long_user)))
            samples["fresh"].append(timed(lambda: admit(fresh_user)))
        sums = {
            name: [_sum_ms(user.pk) for _ in range(5)]
            for name, user in (("long_sum", long_user), ("fresh_sum", fresh_user))
        }
    finally:
        database.purge_tenant(tenant.pk)
        database.delete_bench_jobs()
    found = {name: Series(tuple(v)).median * 1000 for name, v in samples.items()}
    return (
        found
        | {"first": samples["long"][0] * 1000}
        | {name: Series(tuple(v)).median for name, v in sums.items()}
    )


def _sum_ms(user_id: int) -> float:
    """The server's execution time of the admission's balance read for ``user_id`` (the
    user's mark plus the ledger entries since: ``runs.sql``'s ``credit_balance``), ms."""
    from runs.core import queries

    with connection.cursor() as cursor:
        cursor.execute(
            f"EXPLAIN (ANALYZE, TIMING off, SUMMARY on) {queries['credit_balance']}",
            {"user_id": user_id},
        )
        for (line,) in cursor.fetchall():
            if line.startswith("Execution Time:"):
                return float(line.split()[2])
    raise BenchError("EXPLAIN ANALYZE gave no Execution Time")


def run(ctx: Context) -> list[Row]:
    sizes = ctx.sizes
    threads, total = sizes.admit_threads, sizes.admits
    single = max(1, total // 2)
    waits = _Waits(ctx)
    storm_waits = _Waits(ctx)
    rates: dict[str, list[float]] = {"plain_t": [], "pg_t": [], "plain_1": [], "pg_1": []}
    p99s: dict[str, list[float]] = {"plain": [], "pgstage": [], "serial": []}
    p50s: dict[str, list[float]] = {"plain": [], "pgstage": [], "serial": []}
    counts: dict[str, list[dict[str, Any]]] = {"free": [], "queued": [], "defer": []}
    django: dict[str, list[float]] = {"free": [], "queued": [], "defer": []}
    single_waits = _Waits(ctx)
    floors: list[dict[str, float]] = []
    ledgers: list[dict[str, float]] = []
    for rep in range(sizes.repetitions):
        say(f"admission: repetition {rep + 1}/{sizes.repetitions}, {threads} threads")
        rates["plain_t"].append(_defer_rate(waits, threads=threads, total=total))
        rates["pg_t"].append(_admit_rate(ctx, waits, threads=threads, total=total, seed=rep))
        say(f"admission: repetition {rep + 1}/{sizes.repetitions}, 1 thread")
        rates["plain_1"].append(_defer_rate(single_waits, threads=1, total=single))
        rates["pg_1"].append(_admit_rate(ctx, single_waits, threads=1, total=single, seed=rep))
        say(f"admission: repetition {rep + 1}/{sizes.repetitions}, storms of {sizes.storm}")
        for side, storm in (
            ("plain", _storm_defers),
            ("pgstage", _storm_admits),
            ("serial", _storm_serial_defers),
        ):
            latencies = storm(ctx, storm_waits)
            p99s[side].append(percentile(latencies, 99) * 1000)
            p50s[side].append(percentile(latencies, 50) * 1000)
        say(f"admission: repetition {rep + 1}/{sizes.repetitions}, round trips")
        for case, (counted, captured) in _counted(ctx).items():
            n = sizes.counted_admits
            counts[case].append(counted.per(n))
            django[case].append(captured / n)
        say(f"admission: repetition {rep + 1}/{sizes.repetitions}, one admit's time")
        floors.append(_floor(ctx))
        say(f"admission: repetition {rep + 1}/{sizes.repetitions}, a long credit ledger")
        ledgers.append(_long_ledger(ctx))

    scaling = [t / one for t, one in zip(rates["pg_t"], rates["pg_1"], strict=True)]
    plain_scaling = [t / one for t, one in zip(rates["plain_t"], rates["plain_1"], strict=True)]
    trips = {case: _median_profile(counts[case], django[case]) for case in counts}
    rows = [
        Row(
            key="admit_throughput",
            scenario=f"admits/s, {threads} threads over {sizes.admit_users} users",
            unit="admits/s",
            measures=(
                f"{total:,} admits from {threads} threads released together, users drawn "
                f"from {sizes.admit_users} funded ones; release → last return"
            ),
            parameters={"threads": threads, "users": sizes.admit_users, "admits": total},
            result=series(rates["pg_t"]),
            baseline_label=f"plain defers/s, {threads} threads",
            baseline=series(rates["plain_t"]),
            target=Target(on="ratio", op=">=", value=0.7),
            profile={"waits": waits.merged("pgstage"), "baseline_waits": waits.merged("plain")},
        ),
        Row(
            key="admit_throughput_single",
            scenario="admits/s, 1 thread",
            unit="admits/s",
            measures=f"{single:,} admits from one thread; first call → last return",
            parameters={"threads": 1, "users": sizes.admit_users, "admits": single},
            result=series(rates["pg_1"]),
            baseline_label="plain defers/s, 1 thread",
            baseline=series(rates["plain_1"]),
            profile={
                "waits": single_waits.merged("pgstage"),
                "floor_ms": {
                    name: Series(tuple(f[name] for f in floors)).median for name in floors[0]
                },
            },
        ),
        Row(
            key="admit_scaling",
            scenario=f"admits/s, {threads} threads vs 1 thread",
            unit="x",
            measures=(
                f"admits/s with {threads} threads ÷ admits/s with one thread, per repetition"
            ),
            parameters={"threads": threads},
            result=series(scaling),
            baseline_label=f"plain defers, {threads} vs 1 thread",
            baseline=series(plain_scaling),
            target=Target(on="figure", op=">=", value=1.3),
        ),
        Row(
            key="admit_storm_p99",
            scenario=f"{sizes.storm} admits for one user at once, p99",
            unit="ms",
            measures=(
                f"{sizes.storm} threads released together, one admit each for the same user; "
                f"each call timed on its thread; p99 (nearest rank) over {sizes.storms} "
                "storm(s) per repetition; beside them, the baseline's defers sent one after "
                "the other under one lock, as one user's admits are (profile: "
                "serialised_defers_p99_ms)"
            ),
            parameters={"threads": sizes.storm, "storms_per_repetition": sizes.storms},
            result=series(p99s["pgstage"]),
            baseline_label=f"{sizes.storm} plain defers at once, p99",
            baseline=series(p99s["plain"]),
            target=Target(on="ratio", op="<=", value=1.5),
            profile={
                "p50_ms": {side: Series(tuple(v)).median for side, v in p50s.items()},
                "serialised_defers_p99_ms": Series(tuple(p99s["serial"])).median,
                "waits": storm_waits.merged("pgstage"),
                "baseline_waits": storm_waits.merged("plain"),
            },
        ),
        Row(
            key="admit_long_ledger",
            scenario=f"one admit, user with {sizes.ledger_entries:,} ledger entries",
            unit="ms",
            measures=(
                f"median of {sizes.storm} admits on one thread for a user with "
                f"{sizes.ledger_entries:,} credit ledger entries, in turns with the same "
                "admits of a fresh user (the baseline); the entries written in one "
                "statement just before, so the first admit sums them once and folds them "
                "into the user's balance mark (profile: first_admit_ms), and the later "
                "ones read the mark and the entries since (profile: balance_read_ms, the "
                "read's server time after the admits)"
            ),
            parameters={"ledger_entries": sizes.ledger_entries, "admits": sizes.storm},
            result=series([ledger["long"] for ledger in ledgers]),
            baseline_label="the same admits of a fresh user",
            baseline=series([ledger["fresh"] for ledger in ledgers]),
            target=Target(on="ratio", op="<=", value=1.2),
            profile={
                "first_admit_ms": Series(tuple(ledger["first"] for ledger in ledgers)).median,
                "balance_read_ms": Series(tuple(ledger["long_sum"] for ledger in ledgers)).median,
                "fresh_balance_read_ms": Series(
                    tuple(ledger["fresh_sum"] for ledger in ledgers)
                ).median,
            },
        ),
    ]
    for case, label in (
        ("free", "slot free: born pending, process_job enqueued"),
        ("queued", "queued behind the user's active job"),
    ):
        rows.append(
            Row(
                key=f"admit_round_trips_{case}",
                scenario=f"round trips per admit ({label})",
                unit="round trips",
                measures=(
                    "client → server round trips of one analysis_job_admit call, counted on "
                    "the wire (BEGIN, COMMIT and savepoints included); mean over "
                    f"{sizes.counted_admits} admit(s) per repetition"
                ),
                parameters={"admits_per_repetition": sizes.counted_admits},
                result=series([c["round_trips"] for c in counts[case]]),
                baseline_label="plain defer",
                baseline=series([c["round_trips"] for c in counts["defer"]]),
                target=Target(on="figure", op="<=", value=2),
                profile={"counts": {"pgstage": trips[case], "baseline": trips["defer"]}},
            )
        )
    _explain(rows, trips)
    ledger_row = next(row for row in rows if row.key == "admit_long_ledger")
    if ledger_row.met is False:
        extra = Series(tuple(ledger["long"] - ledger["fresh"] for ledger in ledgers)).median
        long_sum = Series(tuple(ledger["long_sum"] for ledger in ledgers)).median
        fresh_sum = Series(tuple(ledger["fresh_sum"] for ledger in ledgers)).median
        allowed = ledger_row.baseline.median * ledger_row.target.value
        ledger_row.cause = (
            f"{extra:.2f} ms more per admit at {sizes.ledger_entries:,} ledger entries; the "
            "two users' admits differ only in the ledger, whose balance the admission "
            "reads under the user's lock as the user's mark plus the entries since. That "
            f"read runs {long_sum:.2f} ms on the server for the long ledger after the "
            f"admits ({fresh_sum:.3f} ms for the fresh user; EXPLAIN ANALYZE's execution "
            "time, median of 5 per repetition), and the target allows "
            f"{allowed:.2f} ms for the whole admit."
        )
    return rows


def _median_profile(per_rep: list[dict[str, Any]], django: list[float]) -> dict[str, Any]:
    middle = sorted(per_rep, key=lambda c: c["round_trips"])[len(per_rep) // 2]
    return {
        "round_trips": middle["round_trips"],
        "statements": middle["statements"],
        "transactions": middle["transactions"],
        "commits": middle["commits"],
        "statements_by_kind": middle["statements_by_kind"],
        "django_captured_statements": Series(tuple(django)).median,
        "top_statements": middle["top_statements"],
    }


def describe_waits(waits: dict[str, Any]) -> str:
    """``62 % of session samples waited on a lock (Lock:transactionid 40 %, …), most
    often in: <statement>`` — or that no lock wait was seen."""
    shares = waits.get("share_by_state", {})
    locks = {s: share for s, share in shares.items() if s.startswith("Lock") and share >= 0.01}
    if not locks:
        return "no session was seen waiting on a lock"
    total = sum(locks.values())
    detail = ", ".join(f"{state} {share:.0%}" for state, share in locks.items())
    text = f"{total:.0%} of the sampled admit sessions waited on a lock ({detail})"
    statements = waits.get("waiting_statements") or []
    if statements:
        text += f", most often in `{statements[0]['statement'][:110]}`"
    idle = shares.get("client: idle in transaction", 0)
    if idle:
        text += f"; {idle:.0%} held their transaction open while Python worked"
    return text


def _split(floor: dict[str, float]) -> str:
    return (
        f"Measured on one thread, uncontended (medians): an admit takes {floor['admit']:.2f} "
        f"ms: {floor['client']:.2f} ms in the harness (Python and psycopg, building the "
        f"pipeline and reading its results; {floor['admit_cpu']:.2f} ms of it CPU), "
        f"{floor['wire']:.2f} ms on the wire (a bare round trip's wait) and about "
        f"{floor['server']:.2f} ms on the server (the round trip's wait less the wire's: "
        "the lock, the statement, the COMMIT, its deferred checks and its WAL flush, all but "
        f"the first under the user's lock), in which the statement runs "
        f"{floor['statement']:.2f} ms; {_planning(floor)}; a plain defer takes "
        f"{floor['defer']:.2f} ms"
    )


def _planning(floor: dict[str, float]) -> str:
    cost = f"{floor['planning']:.2f} ms"
    if floor.get("prepared"):
        return (
            "the statement is prepared and runs on its generic plan, planned once per "
            "connection (unprepared, as behind a transaction pooler, parsing and planning it "
            f"costs {cost} each time)"
        )
    return f"{cost} of it parsing and planning the statement (not prepared: sent each time)"


def _throughput_floor(floor: dict[str, float], *, needed: float, threads: int) -> str:
    """The tenant's budget row is held from its UPSERT in the admit's statement to the end
    of the COMMIT's flush; and an admit costs CPU, in the harness (one interpreter for its
    threads) and the server, which share the machine."""
    row_ceiling = 1000 / floor["budget_row"] if floor["budget_row"] > 0 else float("inf")
    cpu_ceiling = 1000 / floor["admit_cpu"] if floor["admit_cpu"] > 0 else float("inf")
    return (
        f"{_split(floor)}. The admits of one tenant take its budget row (a held run's unit "
        "of the daily provider budget) in turn, each from its UPSERT in the statement to the "
        "end of the COMMIT's WAL flush, part of those "
        f"{floor['budget_row']:.2f} ms: held that long, the row alone would pass about "
        f"{row_ceiling:,.0f} admits/s of one tenant, however many threads (more, as it is "
        f"held for less). An admit costs the harness {floor['admit_cpu']:.2f} ms of CPU, a "
        f"plain defer {floor['defer_cpu']:.2f} ms; the harness's {threads} threads share "
        f"one interpreter lock, and the machine's {os.cpu_count()} CPU(s) with the server: "
        f"at most about {cpu_ceiling:,.0f} admits/s from the harness alone; the target "
        f"needs {needed:,.0f}/s{_cpu_floor(floor, needed=needed)}"
    )


def _cpu_floor(floor: dict[str, float], *, needed: float) -> str:
    """What the machine's CPUs allow both sides, from each call's CPU in the harness and
    in the server's process (measured: ``server_cpu``, ``defer_server_cpu``)."""
    if "server_cpu" not in floor:
        return ""
    admit_total = floor["admit_cpu"] + floor["server_cpu"]
    defer_total = floor["defer_cpu"] + floor["defer_server_cpu"]
    cpus = os.cpu_count() or 1
    ceiling = cpus * 1000 / admit_total
    verdict = (
        "more than the admit's CPU allows on this machine: out of reach here unless an "
        "admit costs less CPU"
        if ceiling < needed
        else "within what the CPU allows: the rest of the gap is waiting (above)"
    )
    return (
        f". In CPU, an admit costs {admit_total:.2f} ms ({floor['admit_cpu']:.2f} in the "
        f"harness, {floor['server_cpu']:.2f} in the server's process, read from /proc), a "
        f"plain defer {defer_total:.2f} ms ({floor['defer_cpu']:.2f} + "
        f"{floor['defer_server_cpu']:.2f}); the harness and the server share the machine's "
        f"{cpus} CPU(s), so with every CPU busy and no wait at all admits reach at most "
        f"about {ceiling:,.0f}/s (plain defers "
        f"{cpus * 1000 / defer_total:,.0f}/s); the target needs {needed:,.0f}/s, {verdict}"
    )


def _storm_floor(floor: dict[str, float], row: Row) -> str:
    """The storm's last admit waits for every other one's time under the user's lock:
    its statement, and the COMMIT with its WAL flush; measured beside it, the baseline's
    defers serialised the same way, which leave only the admit's own work as the rest."""
    size = int(row.parameters["threads"])
    chain = (row.figure or 0.0) / size
    plain = row.baseline.median if row.baseline else 0.0
    target = 1.5 * plain
    text = (
        f"{_split(floor)}. Each admit holds the user's lock up to about "
        f"{floor['under_lock']:.2f} ms uncontended ({floor['statement']:.2f} ms running its "
        f"statement, {floor['commit']:.2f} ms for the rest: the lock, the COMMIT and its "
        f"WAL flush{'' if floor.get('prepared') else ', the planning'}), so the {size}th "
        f"waits about {(size - 1) * floor['under_lock']:,.0f} ms: {size} x "
        "(statement + COMMIT and flush) is the floor while one user's admits are serial "
        f"(invariant 4), and the {size} threads' own {floor['client']:.2f} ms each run "
        f"under one interpreter lock ({size * floor['client']:,.0f} ms in all, overlapping "
        f"the server's); in the storm the p99 is {chain:.1f} ms per admit (the server and "
        f"the {size} client threads share the machine's CPUs); the target is "
        f"{target:,.0f} ms"
    )
    serial = row.profile.get("serialised_defers_p99_ms")
    if serial and plain > 0:
        text += (
            f". The baseline's own defers, sent one after the other under one lock as the "
            "admits of one user are (BEGIN, the lock, the defer and COMMIT in one round "
            f"trip), take {serial:,.0f} ms at p99 in this run, {serial / plain:.2f}x the "
            "plain storm: what serialising them costs by itself; the admit's own work "
            f"makes the rest ({(row.figure or 0.0) - serial:,.0f} ms)"
        )
        if "server_cpu" in floor:
            admit_cpu = floor["admit_cpu"] + floor["server_cpu"]
            defer_cpu = floor["defer_cpu"] + floor["defer_server_cpu"]
            text += (
                f": {admit_cpu:.2f} ms of CPU an admit against {defer_cpu:.2f} ms a defer "
                f"(harness and server), {size * (admit_cpu - defer_cpu):,.0f} ms more in a "
                f"storm, on {os.cpu_count()} CPU(s)"
            )
    return text


def _explain(rows: list[Row], trips: dict[str, dict[str, Any]]) -> None:
    by_key = {row.key: row for row in rows}
    floor = by_key["admit_throughput_single"].profile["floor_ms"]
    free = by_key["admit_round_trips_free"]
    for row in rows:
        if row.met is not False:
            continue
        if row.key == "admit_throughput":
            row.cause = (
                f"each admit is {free.figure:g} round trip(s) (the plain defer: "
                f"{free.baseline.median:g}): the user's lock, the statement (which takes the "
                "held run's unit of the tenant's budget) and the COMMIT, in one pipeline: "
                + describe_waits(row.profile["waits"])
                + ". "
                + _throughput_floor(
                    floor,
                    needed=0.7 * (row.baseline.median if row.baseline else 0.0),
                    threads=int(row.parameters["threads"]),
                )
            )
        elif row.key == "admit_scaling":
            row.cause = "admits of different users still wait for each other: " + describe_waits(
                by_key["admit_throughput"].profile["waits"]
            )
        elif row.key == "admit_storm_p99":
            row.cause = (
                "the admits of one user run one after the other under the user's queue lock, "
                "each holding it for its statement and its COMMIT's WAL flush (no network "
                "wait: the lock, the statement and the COMMIT travel in one round trip): "
                + describe_waits(row.profile["waits"])
                + ". "
                + _storm_floor(floor, row)
            )
        elif row.key.startswith("admit_round_trips"):
            counts = row.profile["counts"]["pgstage"]
            row.cause = (
                f"not yet optimised: {counts_text(counts)}; the work statements: "
                + top_work(counts, n=12, width=60)
            )
