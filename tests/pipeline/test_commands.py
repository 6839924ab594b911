"""The operator commands, through call_command: output, effects and CommandError cases."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from pipeline.models import Anfrage, AuditEntry, PipelineRun
from pipeline.stages import LEDGER
from tests.conftest import jobs
from tests.pipeline.conftest import ITEMS_CSV, ITEMS_TXT, run_stages, submit


def call(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def drop_jobs() -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_jobs")


# --- submit_anfrage


def test_submit_anfrage_prints_the_new_id_last(tenant, tmp_path):
    (tmp_path / "items.txt").write_text(ITEMS_TXT)
    (tmp_path / "list.csv").write_text(ITEMS_CSV)
    out, _ = call(
        "submit_anfrage",
        "--tenant",
        "acme",
        "--title",
        "Hall 3",
        str(tmp_path / "items.txt"),
        str(tmp_path / "list.csv"),
    )
    anfrage_id = int(out.strip().splitlines()[-1])
    anfrage = Anfrage.objects.get(pk=anfrage_id)
    assert anfrage.title == "Hall 3" and anfrage.tenant == tenant
    assert "items.txt" in out and "list.csv" in out
    assert len(jobs(task_name="pipeline.intake")) == 1


@pytest.mark.parametrize(
    ("tenant_slug", "content", "message"),
    [
        ("nobody", ITEMS_TXT, "no tenant 'nobody': create it with"),
        ("acme", None, "cannot read"),
        ("acme", "", "is empty; nothing was created"),
        ("acme", "dear sales team", r"no line reads as a requested item .*; nothing was created"),
    ],
)
def test_submit_anfrage_errors(tenant, tmp_path, tenant_slug, content, message):
    path = tmp_path / "items.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(CommandError, match=message):
        call("submit_anfrage", "--tenant", tenant_slug, str(path))
    assert not Anfrage.objects.exists()


# --- pipeline_status


def test_pipeline_status_overview_and_detail(tenant, other_tenant):
    done = submit(tenant, title="done")
    run_stages(done.id)
    waiting = submit(other_tenant, title="waiting")
    out, _ = call("pipeline_status")
    lines = out.splitlines()
    assert lines[0].split() == [
        "id",
        "tenant",
        "title",
        "intake",
        "extract",
        "feasibility",
        "calculate",
        "total",
    ]
    assert any(
        line.split()[:7]
        == [str(done.id), "acme", "done", "success", "success", "success", "success"]
        for line in lines
    )
    assert any(
        line.split()[:4] == [str(waiting.id), "globex", "waiting", "pending"] for line in lines
    )
    out, _ = call("pipeline_status", "--tenant", "globex")
    assert "waiting" in out and "done" not in out

    out, _ = call("pipeline_status", "--anfrage", str(done.id))
    assert "steel beam HEA 200" in out
    assert "quote total: " in out and "EUR" in out


def test_pipeline_status_errors(tenant):
    with pytest.raises(CommandError, match="no tenant 'nobody'"):
        call("pipeline_status", "--tenant", "nobody")
    with pytest.raises(CommandError, match="no inquiry 4242; run without --anfrage"):
        call("pipeline_status", "--anfrage", "4242")


# --- replay_stage


def test_replay_stage_force_cascade(tenant):
    anfrage = submit(tenant)
    run_stages(anfrage.id)
    drop_jobs()
    out, _ = call(
        "replay_stage",
        "--tenant",
        "acme",
        "--anfrage",
        str(anfrage.id),
        "--stage",
        "extract",
        "--force",
        "--cascade",
    )
    assert "extract, feasibility, calculate" in out and "enqueued job" in out
    assert len(jobs(task_name="pipeline.extract")) == 1
    [entry] = AuditEntry.objects.filter(action="stage.replayed")
    assert entry.actor == "command:replay_stage" and entry.payload["cascade"] is True
    assert set(
        PipelineRun.objects.filter(anfrage=anfrage, status="failed").values_list("stage", flat=True)
    ) == {"extract", "feasibility", "calculate"}


def test_replay_stage_force_without_cascade_is_refused_while_later_stages_succeeded(tenant):
    anfrage = submit(tenant)
    run_stages(anfrage.id)
    count = len(jobs())
    with pytest.raises(CommandError, match=r"feasibility, calculate .* \(add --cascade"):
        call(
            "replay_stage",
            "--tenant",
            "acme",
            "--anfrage",
            str(anfrage.id),
            "--stage",
            "extract",
            "--force",
        )
    assert len(jobs()) == count
    assert not PipelineRun.objects.exclude(status="success").exists()


def test_replay_stage_dry_run_changes_nothing(tenant):
    anfrage = submit(tenant)
    run_stages(anfrage.id)
    count = len(jobs())
    out, _ = call(
        "replay_stage",
        "--tenant",
        "acme",
        "--anfrage",
        str(anfrage.id),
        "--stage",
        "calculate",
        "--force",
        "--dry-run",
    )
    assert "would enqueue" in out and "dry run: nothing changed" in out
    assert len(jobs()) == count
    assert not PipelineRun.objects.exclude(status="success").exists()
    assert not AuditEntry.objects.filter(action="stage.replayed").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tenant", "nobody", "--stage", "extract"], "no tenant 'nobody'"),
        (["--tenant", "acme", "--stage", "bake"], "unknown stage 'bake'; the stages are"),
        (["--tenant", "acme", "--stage", "extract"], r"already succeeded; .* \(pass --force\)"),
        (["--tenant", "globex", "--stage", "extract", "--force"], "no inquiry"),
    ],
)
def test_replay_stage_errors(tenant, other_tenant, args, message):
    anfrage = submit(tenant)
    run_stages(anfrage.id)
    with pytest.raises(CommandError, match=message):
        call("replay_stage", "--anfrage", str(anfrage.id), *args)


# --- replay_failed


def _fail(anfrage, stage: str) -> None:
    LEDGER.fail(
        LEDGER.claim(tenant=anfrage.tenant_id, anfrage=anfrage.id, stage=stage), error="boom"
    )


def test_replay_failed_enqueues_each_failed_run_with_a_progress_bar(tenant, other_tenant):
    first, second, theirs = submit(tenant), submit(tenant), submit(other_tenant)
    for anfrage in (first, second, theirs):
        run_stages(anfrage.id, ["intake"])
        _fail(anfrage, "extract")
    not_ready = submit(tenant)
    _fail(not_ready, "extract")  # intake never succeeded: not replayable
    drop_jobs()

    out, err = call("replay_failed", "--stage", "extract", "--tenant", "acme", "--dry-run")
    assert "2 would enqueue" in out and jobs() == []

    out, err = call("replay_failed", "--stage", "extract", "--tenant", "acme")
    assert "replay extract: 2/2" in err  # a plain line: stderr is not a terminal here
    assert "2 failed extract run(s): 2 enqueued" in out
    assert sorted(j["args"]["anfrage_id"] for j in jobs()) == [first.id, second.id]
    # Again: the jobs are still waiting, so they are joined, not duplicated.
    out, _ = call("replay_failed", "--stage", "extract")
    assert "2 already queued" in out and "1 enqueued" in out
    assert len(jobs()) == 3


def test_replay_failed_errors(db):
    with pytest.raises(CommandError, match="unknown stage 'bake'"):
        call("replay_failed", "--stage", "bake")
    with pytest.raises(CommandError, match="no tenant 'nobody'"):
        call("replay_failed", "--stage", "extract", "--tenant", "nobody")
    out, _ = call("replay_failed", "--stage", "extract")
    assert "nothing to do" in out
