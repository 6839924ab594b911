"""The checker on hand-made histories: each property flags what it must, and excuses what
the framework allows (a run of a dead or partitioned worker, a repeat after a fault)."""

from __future__ import annotations

from typing import Any

from tests.nemesis.checker import check

WORKERS = [
    {"type": "worker", "event": "start", "worker": 0, "pid": 100, "mono": 0.0},
    {"type": "worker", "event": "start", "worker": 1, "pid": 200, "mono": 0.0},
]


def effect(event: str, job_id: int | None, pid: int, mono: float, key: str = "k") -> dict:
    return {
        "type": "effect",
        "event": event,
        "task": "nemesis.effect",
        "key": key,
        "job_id": job_id,
        "pid": pid,
        "mono": mono,
    }


def fault(kind: str, start: float, end: float, fault_id: int, **fields: Any) -> list[dict]:
    return [
        {"type": "fault", "kind": kind, "id": fault_id, "phase": "invoke", "mono": start, **fields},
        {"type": "fault", "kind": kind, "id": fault_id, "phase": "ok", "mono": end},
    ]


def final(**overrides: Any) -> list[dict]:
    return [
        {"type": "quiet", "seconds": 12.0, "mono": 90.0},
        {
            "type": "final",
            "mono": 100.0,
            "invariants": {},
            "liveness": {},
            "extra_safety": {},
            "unfinished": {},
            "generic_jobs": [[1, "nemesis.effect", "succeeded", "k", 1]],
            "restarts": [],
            "domain_counts": {},
            **overrides,
        },
    ]


def properties(history: list[dict]) -> list[str]:
    ordered = sorted(history, key=lambda line: line["mono"])
    return [v["property"].split(" ")[0] for v in check(ordered).violations]


def test_a_second_run_while_a_live_worker_still_runs_the_job_is_a_twin_run():
    history = [
        *WORKERS,
        effect("start", 1, 100, 1.0),
        effect("start", 1, 200, 2.0),
        effect("end", 1, 100, 3.0),
        effect("end", 1, 200, 4.0),
        *final(),
    ]
    assert "G1" in properties(history)
    assert "G2" in properties(history)


def test_a_second_run_after_its_worker_was_killed_or_partitioned_is_allowed():
    killed = [
        *WORKERS,
        effect("start", 1, 100, 1.0),
        {"type": "worker", "event": "exit", "worker": 0, "pid": 100, "mono": 1.5, "expected": True},
        effect("start", 1, 200, 8.0),
        effect("end", 1, 200, 9.0),
        *final(),
    ]
    assert properties(killed) == []
    partitioned = [
        *WORKERS,
        effect("start", 1, 100, 1.0),
        *fault("partition", 1.2, 20.0, 7, worker=0),
        effect("start", 1, 200, 8.0),
        effect("end", 1, 200, 9.0),
        effect("end", 1, 100, 21.0),
        *final(),
    ]
    assert properties(partitioned) == []


def test_a_repeated_completion_needs_a_fault_that_could_lose_the_outcome():
    repeated = [
        *WORKERS,
        effect("start", 1, 100, 1.0),
        effect("end", 1, 100, 2.0),
        effect("start", 1, 200, 5.0),
        effect("end", 1, 200, 6.0),
    ]
    assert properties([*repeated, *final()]) == ["G2"]
    # A sweep by an operator loses no outcome; a terminated session can.
    operator = fault("operator", 2.5, 3.0, 8, action="sweep_stalled")
    assert properties([*repeated, *operator, *final()]) == ["G2"]
    storm = fault("terminate", 1.5, 3.0, 9)
    assert properties([*repeated, *storm, *final()]) == []

    # A settings change (or a deploy) excuses it only on a worker it drained.
    def reconfigured(rolled: list[int]) -> list[dict]:
        lines = fault("reconfigure", 1.5, 3.0, 10, outage_windows=[None, 35.0])
        lines[1]["value"] = {"rolled": [{"worker": w} for w in rolled]}
        return lines

    assert properties([*repeated, *reconfigured([1]), *final()]) == ["G2"]
    assert properties([*repeated, *reconfigured([0]), *final()]) == []


def test_a_hook_runs_once_for_a_job_that_gave_up_and_never_for_one_that_succeeded():
    jobs = [[1, "nemesis.settled", "failed", "a", 2], [2, "nemesis.settled", "succeeded", "b", 1]]
    ran = [
        effect("start", 1, 100, 1.0, key="a"),
        effect("error", 1, 100, 1.5, key="a"),
        effect("start", 2, 100, 2.0, key="b"),
        effect("end", 2, 100, 2.5, key="b"),
    ]
    once = [*ran, effect("hook_committed", None, 100, 3.0, key="a"), *final(generic_jobs=jobs)]
    assert properties([*WORKERS, *once]) == []
    twice = [effect("hook_committed", None, 200, 4.0, key="a"), *once]
    assert properties([*WORKERS, *twice]) == ["G4"]
    # A hook whose transaction rolled back runs again: one commit is what counts.
    rolled_back = [effect("hook", None, 100, 2.8, key="a"), effect("hook", None, 100, 2.9, key="a")]
    assert properties([*WORKERS, *rolled_back, *once]) == []
    never = [*ran, *final(generic_jobs=jobs)]
    assert properties([*WORKERS, *never]) == ["G4"]
    wrong = [effect("hook_committed", None, 100, 3.0, key="b"), *once]
    assert properties([*WORKERS, *wrong]) == ["G4"]


def test_a_job_that_failed_without_running_or_never_completed_is_lost():
    enqueued = {"type": "op", "op": "effect", "phase": "ok", "value": 1, "mono": 0.5}
    never_ran = [*WORKERS, enqueued, *final(generic_jobs=[[1, "nemesis.effect", "failed", "k", 1]])]
    assert properties(never_ran) == ["G3"]
    hooked = [[1, "nemesis.new_effect", "failed", "k", 1]]
    # A job with a hook that failed without running is lost, and its hook is owed.
    assert properties([*WORKERS, *final(generic_jobs=hooked)]) == ["G3", "G4"]
    broke = [effect("start", 1, 100, 1.0), effect("error", 1, 100, 1.5)]
    failed = final(generic_jobs=[[1, "nemesis.effect", "failed", "k", 3]])
    assert properties([*WORKERS, enqueued, *broke, *failed]) == ["G3"]


def test_not_quiet_a_late_restart_and_an_exit_with_the_database_up_are_violations():
    history = [
        # Worker 0 runs a window of 5 s: its exit 5 s into the outage is its due.
        {**WORKERS[0], "outage_window": 5.0},
        WORKERS[1],
        *fault("pg_down", 4.0, 10.0, 3),
        {"type": "database", "event": "up", "mono": 10.0},
        # Exits while the database was away are measured, not violations.
        {"type": "worker", "event": "exit", "worker": 0, "pid": 100, "code": 1, "mono": 9.0},
        {"type": "worker", "event": "exit", "worker": 1, "pid": 200, "code": 1, "mono": 13.0},
        *final(restarts=[{"wall": 0, "seconds": 9.5, "jobs": 3}], generic_jobs=[]),
    ]
    history[-2]["seconds"] = None
    assert properties(history) == ["L1", "L2", "L3"]
    ordered = sorted(history, key=lambda line: line["mono"])
    assert check(ordered).measures["exits_while_unreachable_after_seconds"] == [5.0]


def test_a_worker_that_gives_up_sooner_than_its_outage_window_is_a_violation():
    def gave_up(at: float, window: float | None) -> list[dict]:
        start = {**WORKERS[0], "outage_window": window} if window else WORKERS[0]
        return [
            start,
            WORKERS[1],
            *fault("pg_down", 4.0, 30.0, 3),
            {"type": "database", "event": "up", "mono": 30.0, "after": 26.0},
            {"type": "worker", "event": "exit", "worker": 0, "pid": 100, "code": 1, "mono": at},
            *final(generic_jobs=[]),
        ]

    # 6 s into the outage, with a window of 12 s (or the default 300 s): too soon.
    assert properties(gave_up(10.0, 12.0)) == ["L3"]
    assert properties(gave_up(10.0, None)) == ["L3"]
    # 13 s in, past its 12 s window: its due (measured, not a violation).
    assert properties(gave_up(17.0, 12.0)) == []
    # Partitioned from 10 s to 40 s, the database away from 30 s to 80 s: cut off without
    # a break from 10 s on, so its exit at 45 s is its 35 s window's due, not 20 s early.
    overlapping = [
        {**WORKERS[0], "outage_window": 35.0},
        WORKERS[1],
        *fault("partition", 10.0, 40.0, 4, worker=0),
        *fault("pg_down", 30.0, 80.0, 5),
        {"type": "database", "event": "up", "mono": 80.0, "after": 50.0},
        {"type": "worker", "event": "exit", "worker": 0, "pid": 100, "code": 1, "mono": 45.0},
        *final(generic_jobs=[]),
    ]
    assert properties(overlapping) == []
    ordered = sorted(gave_up(17.0, 12.0), key=lambda line: line["mono"])
    assert check(ordered).measures["exits_while_unreachable_after_seconds"] == [13.0]


def test_a_late_start_after_an_outage_every_running_worker_gave_up_on_is_excused():
    """L2 holds after an outage shorter than some running worker's window: past every
    one's, each had exited and started afresh."""

    def late(windows: tuple[float, float], *, restarted: float | None = None) -> list[dict]:
        starts = [
            {**WORKERS[0], "outage_window": windows[0]},
            {**WORKERS[1], "outage_window": windows[1]},
        ]
        if restarted is not None:
            # Worker 1 was reconfigured to the default window before the outage.
            starts += [
                {"type": "worker", "event": "exit", "worker": 1, "pid": 200, "mono": 1.0,
                 "expected": True},
                {"type": "worker", "event": "start", "worker": 1, "pid": 201, "mono": 1.5,
                 "outage_window": restarted},
            ]  # fmt: skip
        return [
            *starts,
            *fault("pg_down", 4.0, 24.0, 3),
            {"type": "database", "event": "up", "mono": 24.0, "after": 20.0},
            *final(restarts=[{"wall": 0, "seconds": 7.5, "jobs": 3}], generic_jobs=[]),
        ]

    assert properties(late((12.0, 12.0))) == []
    assert properties(late((12.0, 300.0))) == ["L2"]
    assert properties(late((12.0, 12.0), restarted=300.0)) == ["L2"]
    assert properties(late((12.0, 300.0), restarted=12.0)) == []


def test_the_workers_log_lines_of_prunes_and_registrations_are_counted(tmp_path):
    from tests.nemesis.worker_logs import pruning_lines

    log = tmp_path / "worker-0.1.log"
    log.write_text(
        "2026-12-02 14:30:07,202 INFO queueing.worker: pruned dead workers: 3, 7\n"
        "2026-12-02 14:30:09,500 WARNING queueing.worker: worker 4 was pruned while cut off"
        " from the database; registered again as 9 and took back 2 running job(s)\n"
        "2026-12-02 14:30:10,000 INFO procrastinate.worker: job succeeded id=92\n"
    )
    start = {**WORKERS[0], "log": str(log), "wall": 0.0}
    lines = pruning_lines([start])
    assert [(line["event"], line["worker"], line["pid"]) for line in lines] == [
        ("pruned", 0, 100),
        ("registered_again", 0, 100),
    ]
    assert lines[0]["ids"] == [3, 7]
    assert (lines[1]["old"], lines[1]["new"], lines[1]["adopted"]) == (4, 9, 2)
    assert round(lines[1]["mono"] - lines[0]["mono"], 3) == 2.298
    history = [*WORKERS, *lines, *final()]
    measures = check(sorted(history, key=lambda line: line["mono"])).measures
    assert (measures["pruned_workers"], measures["registered_again"]) == (2, 1)
    # Worker 4's row was not among the pruned (3, 7): it registered again for nothing.
    assert properties(history) == ["L5"]
    lines[0]["ids"].append(4)
    assert properties(history) == []


def test_domain_invariants_from_the_final_read_are_violations():
    history = [
        *WORKERS,
        *final(
            invariants={"5b. at most one refund per job": [[3, 2]]},
            extra_safety={"a complete analysis was refunded": [[3]]},
            generic_jobs=[],
        ),
    ]
    assert properties(history) == ["invariant", "a"]
    during = {"type": "check", "mono": 5.0, "violations": {"4. per user": [[7, 2]]}}
    assert properties([*history, during]) == ["invariant", "invariant", "a"]


def test_a_late_restart_is_excused_only_by_a_fault_that_stops_every_worker():
    def late(*faults: dict, jobs: int = 3, seconds: float = 7.5) -> list[dict]:
        return [
            *WORKERS,
            *fault("pg_down", 4.0, 12.0, 3),
            {"type": "database", "event": "up", "mono": 10.0, "after": 6.0},
            *faults,
            *final(
                restarts=[
                    {"wall": 0, "seconds": 0.4, "jobs": 1},
                    {"wall": 0, "seconds": seconds, "jobs": jobs},
                ],
                generic_jobs=[],
            ),
            {"type": "database", "event": "up", "mono": 2.0, "after": 1.0},
        ]

    # The outage's own window (its operator's sweep after the return) excuses nothing; a
    # partition or a kill takes one worker, and the others must start the waiting jobs.
    assert properties(late()) == ["L2"]
    assert properties(late(*fault("partition", 9.0, 30.0, 4, worker=0))) == ["L2"]
    assert properties(late(*fault("kill", 11.0, 12.0, 4, worker=1))) == ["L2"]
    # A storm of terminated sessions, a lock on procrastinate_jobs or the next outage holds
    # every worker back; with no job waiting for the return, nothing was late to start.
    assert properties(late(*fault("terminate", 9.0, 13.0, 4))) == []
    locked = fault("statement_timeout", 11.0, 14.0, 4, table="procrastinate_jobs")
    assert properties(late(*locked)) == []
    assert properties(late(*fault("pg_restart", 15.0, 16.0, 4))) == []
    assert properties(late(jobs=0)) == []
    assert properties(late(seconds=4.9)) == []
    ordered = sorted(late(), key=lambda line: line["mono"])
    assert check(ordered).measures["restart_seconds_max"] == 7.5


def test_a_fault_that_began_after_the_bound_had_passed_excuses_no_late_restart():
    def late(*faults: dict) -> list[dict]:
        return [
            *WORKERS,
            *fault("pg_restart", 8.0, 10.0, 3),
            {"type": "database", "event": "up", "mono": 10.0, "after": 1.5},
            *faults,
            *final(restarts=[{"wall": 0, "seconds": 6.7, "jobs": 34}], generic_jobs=[]),
        ]

    # The jobs started 16.7 s in, 6.7 s after the return; the bound ended at 15.0 s. A fault
    # that held every worker back by then excuses the late start; one that began after it,
    # though it overlaps the wait, was not what kept the jobs waiting.
    assert properties(late()) == ["L2"]
    assert properties(late(*fault("pg_restart", 15.0, 16.0, 4))) == []
    assert properties(late(*fault("pg_restart", 15.6, 16.5, 4))) == ["L2"]
    assert properties(late(*fault("pg_down", 16.0, 30.0, 4))) == ["L2"]
    assert properties(late(*fault("terminate", 14.0, 20.0, 4))) == []
    assert properties(late(*fault("terminate", 15.5, 20.0, 4))) == ["L2"]
    locked = fault("statement_timeout", 15.5, 20.0, 4, table="procrastinate_jobs")
    assert properties(late(*locked)) == ["L2"]
    locked_in_time = fault("statement_timeout", 12.0, 20.0, 4, table="procrastinate_jobs")
    assert properties(late(*locked_in_time)) == []


def test_a_late_restart_while_every_slot_stayed_busy_is_no_violation():
    """Workers whose every slot holds a run begun before the return can start nothing: the
    start is late because they are busy, not stuck. A draining worker fetches nothing, so
    its slots do not count; a worker with a slot free must start a job within the bound."""
    run = {"type": "run", "mono": 0.0, "concurrency": 2}
    third = {"type": "worker", "event": "start", "worker": 2, "pid": 300, "mono": 0.0}
    busy = [
        effect("start", 11, 100, 1.0),
        effect("start", 12, 100, 2.0),
        effect("start", 21, 200, 3.0),
        effect("start", 22, 200, 4.0),
        effect("end", 11, 100, 19.0),
        effect("end", 12, 100, 20.0),
        effect("end", 21, 200, 21.0),
        effect("end", 22, 200, 22.0),
    ]

    def late(*lines: dict) -> list[dict]:
        return [
            run,
            *WORKERS,
            *fault("pg_restart", 8.0, 10.0, 3),
            {"type": "database", "event": "up", "mono": 10.0, "after": 0.2},
            *lines,
            *final(restarts=[{"wall": 0, "seconds": 9.0, "jobs": 13}], generic_jobs=[]),
        ]

    assert properties(late(*busy)) == []
    assert check(sorted(late(*busy), key=lambda line: line["mono"])).measures[
        "late_restarts_excused"
    ] == [{"seconds": 9.0, "by": ["every slot busy"]}]
    # One slot freed within the bound: that worker had to start a job.
    freed = [line for line in busy if not (line["job_id"] == 22 and line["event"] == "end")]
    assert properties(late(*freed, effect("end", 22, 200, 12.0))) == ["L2"]
    # A third worker with free slots, draining since before the return: busy all the same.
    drained = [
        third,
        {"type": "worker", "event": "signal", "worker": 2, "pid": 300, "mono": 9.0},
        {
            "type": "worker",
            "event": "exit",
            "worker": 2,
            "pid": 300,
            "mono": 13.0,
            "expected": True,
        },
    ]
    assert properties(late(*busy, *drained)) == []
    # Not draining, started before the return: it was idle, and late.
    assert properties(late(*busy, third)) == ["L2"]
    # Partitioned within the bound: cut off, it could fetch nothing either.
    partitioned = fault("partition", 12.0, 30.0, 5, worker=2)
    assert properties(late(*busy, third, *partitioned)) == []
    # A worker started after the return boots: it is not the one that was late.
    booting = {"type": "worker", "event": "start", "worker": 2, "pid": 300, "mono": 11.0}
    assert properties(late(*busy, booting)) == []


def test_slots_busy_up_to_the_bound_do_not_excuse_a_start_long_after_they_freed():
    """Busy slots excuse a late start only while they stay busy: a worker whose slots freed
    a second after the bound, and which then started nothing for a minute, is stuck, not
    busy. Likewise a short partition within the bound does not excuse the idle minute
    after it healed. Only a worker with no bound-long stretch of free time before the
    start is excused."""
    run = {"type": "run", "mono": 0.0, "concurrency": 2}
    third = {"type": "worker", "event": "start", "worker": 2, "pid": 300, "mono": 0.0}

    def busy(until: float) -> list[dict]:
        return [
            effect("start", 11, 100, 1.0),
            effect("start", 12, 100, 2.0),
            effect("start", 21, 200, 3.0),
            effect("start", 22, 200, 4.0),
            effect("end", 11, 100, until),
            effect("end", 12, 100, until),
            effect("end", 21, 200, until),
            effect("end", 22, 200, until),
        ]

    def late(seconds: float, *lines: dict) -> list[dict]:
        return [
            run,
            *WORKERS,
            *fault("pg_restart", 8.0, 10.0, 3),
            {"type": "database", "event": "up", "mono": 10.0, "after": 0.2},
            *lines,
            *final(restarts=[{"wall": 0, "seconds": seconds, "jobs": 13}], generic_jobs=[]),
        ]

    # Free from 16 s on (the bound ended at 15 s), the first job started at 70 s.
    assert properties(late(60.0, *busy(16.0))) == ["L2"]
    # Free from 16 s on, the first job started within a bound of it: busy, not stuck.
    assert properties(late(10.0, *busy(16.0))) == []
    # Busy until a bound before the start: excused however late.
    assert properties(late(60.0, *busy(66.0))) == []
    # Partitioned for half a second within the bound, then idle for a minute.
    blip = fault("partition", 12.0, 12.5, 5, worker=2)
    assert properties(late(60.0, *busy(80.0), third, *blip)) == ["L2"]
    # Partitioned up to a bound before the start: it could fetch nothing.
    cut = fault("partition", 12.0, 67.0, 5, worker=2)
    assert properties(late(60.0, *busy(80.0), third, *cut)) == []


def failed_fetch(pid: int, worker: int, mono: float, attempt: int, failing: float) -> dict:
    return {
        "type": "fetch_failing",
        "mono": mono,
        "worker": worker,
        "pid": pid,
        "attempt": attempt,
        "failing_seconds": failing,
        "error": "FeatureNotSupported: cached plan must not change result type",
    }


def test_fetches_failing_past_the_bound_with_no_fault_to_explain_them_are_stuck():
    """A worker failing to fetch for 6 s with the database up is stuck (L4); failures
    during an outage and up to the bound after it are not; a deploy's migration explains
    only its own seconds."""
    stuck = [failed_fetch(100, 0, 10.0 + t, t + 1, t) for t in range(7)]
    assert set(properties([*WORKERS, *stuck, *final()])) == {"L4"}
    outage = fault("pg_down", 8.0, 14.0, 1, seconds=6.0)
    assert properties([*WORKERS, *outage, *stuck, *final()]) == []
    after = [failed_fetch(100, 0, 10.0 + t, t + 1, t) for t in range(11)]
    assert set(properties([*WORKERS, *outage, *after, *final()])) == {"L4"}
    other = fault("reset", 9.0, 16.0, 2, worker=1)
    assert set(properties([*WORKERS, *other, *stuck, *final()])) == {"L4"}
    deploy = fault("deploy", 9.5, 30.0, 3, to="new")
    deploy[1]["value"] = {"migration": "done", "migration_seconds": 0.2}
    assert set(properties([*WORKERS, *deploy, *stuck, *final()])) == {"L4"}
    deploy[1]["value"]["migration_seconds"] = 12.0
    assert properties([*WORKERS, *deploy, *stuck, *final()]) == []


def test_the_workers_log_lines_of_failed_fetches_are_read_back():
    from tests.nemesis.worker_logs import failed_fetches

    log = (
        "2026-12-02 14:30:07,202 INFO procrastinate.worker: job succeeded id=92\\n"
        "2026-12-02 14:30:07,676 ERROR queueing.worker: database error while fetching jobs"
        " (attempt 1, failing for 0 s): FeatureNotSupported: cached plan must not change"
        " result type; next attempt in 0.2 s\\n"
        "2026-12-02 14:30:13,682 ERROR queueing.worker: database error while fetching jobs"
        " (attempt 5, failing for 6 s): OperationalError: gone; next attempt in 5.9 s\\n"
    ).replace("\\n", "\n")
    found = failed_fetches(log)
    assert [(attempt, failing) for _, attempt, failing, _ in found] == [(1, 0.0), (5, 6.0)]
    assert round(found[1][0] - found[0][0], 3) == 6.006
    assert found[0][3] == "FeatureNotSupported: cached plan must not change result type"


def test_a_stuck_stretch_is_not_excused_by_a_fault_at_its_end_nor_short_failures_by_number():
    """A fault that begins as a long unexplained stretch ends excuses only what it
    covers; five failed fetches outside every fault are a stuck worker even if each
    stretch is one attempt long."""
    stuck = [failed_fetch(100, 0, 10.0 + t, t + 1, t) for t in range(21)]
    storm = fault("terminate", 29.5, 35.0, 1, seconds=5.5)
    assert "L4" in properties([*WORKERS, *storm, *stuck, *final()])
    now_and_then = [failed_fetch(100, 0, 10.0 + 10 * n, 1, 0.0) for n in range(5)]
    assert properties([*WORKERS, *now_and_then, *final()]) == ["L4"]
    assert properties([*WORKERS, *now_and_then[:4], *final()]) == []


def test_busy_slots_and_then_the_next_outage_together_excuse_a_late_start():
    """Seed 41 (300 s, every kind) found it: after a restart every slot stayed busy for
    10 s, and 0.1 s after the first slot freed the database went away for 41 s; jobs
    started as it returned, 51 s after the restart. Neither cause alone covers the 51 s
    (the outage began after the bound; the slots freed long before the start): together
    they left no free, connected stretch of a bound. A gap of a bound between them does."""
    run = {"type": "run", "mono": 0.0, "concurrency": 2}

    def late(slots_free_at: float) -> list[dict]:
        return [
            run,
            *WORKERS,
            *fault("pg_restart", 8.0, 10.0, 3),
            {"type": "database", "event": "up", "mono": 10.0, "after": 0.2},
            effect("start", 11, 100, 1.0),
            effect("start", 12, 100, 2.0),
            effect("start", 21, 200, 3.0),
            effect("start", 22, 200, 4.0),
            effect("end", 11, 100, slots_free_at),
            effect("end", 12, 100, slots_free_at + 3),
            effect("end", 21, 200, slots_free_at),
            effect("end", 22, 200, slots_free_at + 3),
            *fault("pg_down", 20.2, 61.4, 4, seconds=41.0),
            {"type": "database", "event": "up", "mono": 61.4, "after": 41.0},
            *final(restarts=[{"wall": 0, "seconds": 51.3, "jobs": 10}], generic_jobs=[]),
        ]

    assert properties(late(slots_free_at=20.1)) == []
    assert properties(late(slots_free_at=14.0)) == ["L2"]


def test_a_job_whose_worker_died_under_it_past_the_stall_bound_may_fail():
    """Seed 42 (300 s, every kind) found it: job 288's worker was SIGKILLed during each
    of its four runs, and stalled recovery failed it after three recoveries ("its worker
    died 4 times"), its poison-pill bound. Not lost: one completed run, or one run whose
    worker lived, makes such a failure a lost job again."""
    from tests.nemesis.checker import STALL_RECOVERIES
    from tests.nemesis.cluster import WORKER_SETTINGS

    assert int(WORKER_SETTINGS["STALLED_JOB_MAX_RECOVERIES"]) == STALL_RECOVERIES
    pids = [100, 101, 102, 103]
    lives = [
        {"type": "worker", "event": "start", "worker": 0, "pid": pid, "mono": 10.0 * n}
        for n, pid in enumerate(pids)
    ]
    deaths = [
        {
            "type": "worker",
            "event": "exit",
            "worker": 0,
            "pid": pid,
            "mono": 10.0 * n + 5,
            "code": -9,
            "expected": True,
        }
        for n, pid in enumerate(pids)
    ]
    enqueue = [{"type": "op", "op": "effect", "phase": "ok", "value": 1, "mono": 0.5}]
    starts = [effect("start", 1, pid, 10.0 * n + 1) for n, pid in enumerate(pids)]
    failed = final(generic_jobs=[[1, "nemesis.effect", "failed", "k", 1]])
    assert properties([*lives, *deaths, *enqueue, *starts, *failed]) == []
    assert properties([*lives, *deaths[:3], *enqueue, *starts, *failed]) == ["G3"]
    assert properties([*lives, *deaths, *enqueue, *starts[:3], *failed]) == ["G3"]
    # Seed 12: the fourth run reached its end after a partition under it (its job already
    # failed by recovery): its outcome could not be saved, so it counts; the same end on a
    # worker that was never cut off makes it lost.
    ended = effect("end", 1, 103, 38.0)
    cut = fault("partition", 32.0, 37.0, 9, worker=0)
    assert properties([*lives, *deaths[:3], *enqueue, *starts, ended, *cut, *failed]) == []
    assert properties([*lives, *deaths[:3], *enqueue, *starts, ended, *failed]) == ["G3"]
