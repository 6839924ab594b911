"""The pipeline's admin: every page renders with rows present, filters and searches work,
system rows are read-only, the replay actions call the replay service and say what
happened, each run links its procrastinate jobs, and a stage the resume sweep gave up on
is shown as such.

Fault model: the admin writes only through the replay service, so its faults (a replay
racing a stage, two replays at once) are those of ``test_replay.py``; here an operator
acting on stale rows is refused with the reason (test_replay_actions), and a given-up
stage is visible and replayable (test_a_stage_the_resume_sweep_gave_up_on_is_shown_and_replayable).
"""

from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from pipeline.models import AuditEntry, Catalog, CatalogItem, PipelineRun, Stage, Unit
from tests.conftest import jobs
from tests.factories import UserFactory
from tests.pipeline.conftest import run_stages, submit

PIPELINE_MODELS = sorted(
    (model for model in admin.site._registry if model._meta.app_label == "pipeline"),
    key=lambda model: model._meta.model_name,
)


@pytest.fixture
def admin_client(client, tenant):
    user = UserFactory(username="root", tenant=tenant, is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


@pytest.fixture
def finished(tenant):
    """One inquiry through all four stages (with an unreadable line, so a warning), and a
    tenant catalog: a row in every pipeline table."""
    catalog = Catalog.objects.create(
        tenant=tenant, name="Acme", currency="EUR", materials={"S235": ["steel"]}
    )
    CatalogItem.objects.create(
        catalog=catalog,
        code="beam",
        name="Beam",
        keywords=["beam"],
        materials=["S235"],
        unit=Unit.PIECES,
        price_breaks=[["1", "100.00"]],
    )
    anfrage = submit(tenant, {"a.txt": "12 pcs steel beam HEA 200, 6 m\nhuh\n"})
    run_stages(anfrage.id)
    return anfrage


def result_count(response) -> int:
    assert response.status_code == 200
    return response.context["cl"].result_count


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_every_pipeline_table_is_registered():
    names = {model._meta.model_name for model in PIPELINE_MODELS}
    assert names >= {
        "anfrage",
        "pipelinerun",
        "position",
        "anfragefile",
        "extractionwarning",
        "auditentry",
        "catalog",
    }


@pytest.mark.parametrize("model", PIPELINE_MODELS, ids=lambda m: m._meta.model_name)
def test_changelist_search_age_and_change_page_render(admin_client, finished, model):
    model_admin = admin.site._registry[model]
    changelist = reverse(f"admin:pipeline_{model._meta.model_name}_changelist")

    assert result_count(admin_client.get(changelist)) >= 1
    # Words and numbers alike: an id search never fails on a word.
    for term in ("beam", str(finished.id), "x'y"):
        assert admin_client.get(changelist, {"q": term}).status_code == 200
    if model_admin.date_hierarchy:
        today = timezone.localdate()
        field = model_admin.date_hierarchy
        assert result_count(admin_client.get(changelist, {f"{field}__year": today.year})) >= 1
    row = model.objects.first()
    page = admin_client.get(
        reverse(f"admin:pipeline_{model._meta.model_name}_change", args=[row.pk])
    )
    assert page.status_code == 200


def test_system_rows_are_read_only(admin_client, finished):
    entry = AuditEntry.objects.first()
    page = admin_client.get(reverse("admin:pipeline_auditentry_change", args=[entry.id]))
    assert page.status_code == 200 and b"Save" not in page.content
    assert admin_client.get(reverse("admin:pipeline_auditentry_add")).status_code == 403
    run = PipelineRun.objects.first()
    response = admin_client.post(
        reverse("admin:pipeline_pipelinerun_change", args=[run.id]), {"status": "failed"}
    )
    assert response.status_code == 403
    run.refresh_from_db()
    assert run.status == "success"


def test_filters(admin_client, finished, tenant, other_tenant):
    other = submit(other_tenant)
    run_stages(other.id, stages=(Stage.INTAKE,))
    runs = reverse("admin:pipeline_pipelinerun_changelist")

    assert result_count(admin_client.get(runs)) == 5
    assert result_count(admin_client.get(runs, {"stage": "extract"})) == 1
    assert result_count(admin_client.get(runs, {"status": "success", "stage": "intake"})) == 2
    assert result_count(admin_client.get(runs, {"tenant__id__exact": other_tenant.id})) == 1
    assert result_count(admin_client.get(runs, {"q": str(other.id)})) == 1
    assert result_count(admin_client.get(runs, {"started_at__year": 2001})) == 0
    inquiries = reverse("admin:pipeline_anfrage_changelist")
    assert result_count(admin_client.get(inquiries, {"tenant__id__exact": tenant.id})) == 1
    board = admin_client.get(inquiries)
    assert b"intake success" in board.content and b"extract pending" in board.content


def test_catalog_shows_whether_it_is_valid(admin_client, finished, tenant):
    page = admin_client.get(reverse("admin:pipeline_catalog_changelist"))
    assert b"valid (1 item(s))" in page.content
    Catalog.objects.filter(tenant=tenant).update(materials={})
    page = admin_client.get(reverse("admin:pipeline_catalog_changelist"))
    assert b"invalid: a catalog needs materials" in page.content


def test_runs_and_inquiries_link_their_procrastinate_jobs(admin_client, tenant):
    anfrage = submit(tenant)  # enqueues intake: exclusive/intake:acme:<id>
    run_stages(anfrage.id, stages=(Stage.INTAKE,))  # enqueues extract
    lock = f"exclusive/extract:acme:{anfrage.id}"
    [extract_job] = jobs(queueing_lock=lock)

    page = admin_client.get(reverse("admin:pipeline_pipelinerun_changelist"))
    link = f"procrastinatejob/?queueing_lock=exclusive%2Fintake%3Aacme%3A{anfrage.id}"
    assert link.encode() in page.content
    listed = admin_client.get("/admin/procrastinate/procrastinatejob/", {"queueing_lock": lock})
    assert [job.pk for job in listed.context["cl"].result_list] == [extract_job["id"]]
    # The inquiry links the jobs of all four stages at once.
    detail = admin_client.get(reverse("admin:pipeline_anfrage_change", args=[anfrage.id]))
    link = detail.content.split(b'href="/admin/procrastinate/procrastinatejob/?')[1]
    query = link.split(b'"')[0].replace(b"&amp;", b"&").decode()
    every_stage = admin_client.get(f"/admin/procrastinate/procrastinatejob/?{query}")
    assert every_stage.context["cl"].result_count == 2  # intake (done) and extract (waiting)


def test_replay_actions(admin_client, finished):
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_jobs")
    run = PipelineRun.objects.get(anfrage=finished, stage="feasibility")
    changelist = reverse("admin:pipeline_pipelinerun_changelist")
    # A successful stage is refused by the plain action (it needs force), in the admin's
    # words, not a command's flags ...
    response = admin_client.post(
        changelist, {"action": "replay_stage", "_selected_action": [run.id]}, follow=True
    )
    assert messages_of(response) == [
        f"1 replay(s) refused: #{finished.id} feasibility: stage feasibility of inquiry "
        f"{finished.id} already succeeded; only a forced replay runs it again "
        "(use “Force replay stage and the stages after it”)"
    ]
    assert "--" not in messages_of(response)[0]
    assert jobs() == []
    # ... and replayed by the forced one, which cascades, once confirmed.
    response = admin_client.post(
        changelist,
        {"action": "force_replay_cascade", "_selected_action": [run.id], "confirmed": "yes"},
        follow=True,
    )
    assert messages_of(response) == [
        f"1 replay(s) queued, 2 stage(s) reset to run again: "
        f"#{finished.id} feasibility (reset feasibility, calculate)"
    ]
    assert [j["task_name"] for j in jobs()] == ["pipeline.feasibility"]
    [entry] = AuditEntry.objects.filter(action="stage.replayed")
    assert entry.actor == "admin:root" and entry.payload["reopened"] == ["feasibility", "calculate"]
    # Again, with calculate too: one replay per inquiry (from its earliest stage); its
    # job is still waiting, so no second job.
    calculate = PipelineRun.objects.get(anfrage=finished, stage="calculate")
    response = admin_client.post(
        changelist,
        {
            "action": "force_replay_cascade",
            "_selected_action": [run.id, calculate.id],
            "confirmed": "yes",
        },
        follow=True,
    )
    assert messages_of(response) == [
        f"1 replay(s) found a job of the stage waiting or running; no second job was queued "
        f"(the replay is audited and reset what had succeeded): #{finished.id} feasibility"
    ]
    assert len(jobs()) == 1


def test_a_forced_replay_is_confirmed_on_a_page_that_lists_what_it_resets(admin_client, finished):
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_jobs")
    extract = PipelineRun.objects.get(anfrage=finished, stage="extract")
    calculate = PipelineRun.objects.get(anfrage=finished, stage="calculate")
    changelist = reverse("admin:pipeline_pipelinerun_changelist")
    page = admin_client.post(
        changelist,
        {"action": "force_replay_cascade", "_selected_action": [extract.id, calculate.id]},
    )
    assert page.status_code == 200
    [plan] = page.context["plans"]
    assert (plan.run.stage, plan.resets, plan.refused) == (
        "extract",
        ("extract", "feasibility", "calculate"),
        "",
    )
    assert b"extract, feasibility, calculate" in page.content
    assert b'name="confirmed" value="yes"' in page.content
    # Showing the page wrote nothing.
    assert jobs() == []
    assert not AuditEntry.objects.filter(action="stage.replayed").exists()
    assert set(PipelineRun.objects.values_list("status", flat=True)) == {"success"}
    # Confirmed: all three are reset, and counted as such.
    response = admin_client.post(
        changelist,
        {
            "action": "force_replay_cascade",
            "_selected_action": [extract.id, calculate.id],
            "confirmed": "yes",
        },
        follow=True,
    )
    assert messages_of(response) == [
        f"1 replay(s) queued, 3 stage(s) reset to run again: "
        f"#{finished.id} extract (reset extract, feasibility, calculate)"
    ]


def test_stages_waiting_for_a_replay_show_as_waiting(admin_client, finished):
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_jobs")
    run = PipelineRun.objects.get(anfrage=finished, stage="extract")
    changelist = reverse("admin:pipeline_pipelinerun_changelist")
    admin_client.post(
        changelist,
        {"action": "force_replay_cascade", "_selected_action": [run.id], "confirmed": "yes"},
    )
    listed = admin_client.get(changelist)
    shown = {r.stage: r.display_status for r in listed.context["cl"].result_list}
    assert shown == {
        "intake": "success",
        "extract": "waiting (replay)",
        "feasibility": "waiting (replay)",
        "calculate": "waiting (replay)",
    }
    assert b"failed" not in listed.content.split(b'id="result_list"')[1].split(b"</table>")[0]
    board = admin_client.get(reverse("admin:pipeline_anfrage_changelist"))
    assert b"extract waiting (replay)" in board.content
    # Once the stage runs again, its status is its own.
    run_stages(finished.id)
    assert {r.display_status for r in PipelineRun.objects.all()} == {"success"}


def test_the_runs_list_fits_a_1400_px_window(admin_client, finished):
    """The list stays narrow whatever the rows hold: a long title and a long error are
    cut, whole in a tooltip. Judged by the text of the widest row: at about 7 px a
    character, 1400 px less the filter column (~250 px) and the paddings (~20 px a
    column) hold some 130 characters."""
    finished.title = "Hallenerweiterung Nord, Bauabschnitt 3: Stahlbau und Dachtragwerk"
    finished.save(update_fields=["title"])
    PipelineRun.objects.filter(anfrage=finished, stage="calculate").update(
        status="failed",
        error="StageInputChanged: catalog item 'beam' of position 1 is no longer in the "
        "catalog; replay feasibility and the stages after it",
    )
    page = admin_client.get(reverse("admin:pipeline_pipelinerun_changelist"))
    table = page.content.decode().split('id="result_list"')[1].split("</table>")[0]
    rows = [re.sub(r"<[^>]+>", "|", row) for row in table.split("<tr")[2:]]
    widest = max(sum(len(cell.strip()) for cell in row.split("|") if cell.strip()) for row in rows)
    assert widest <= 130, rows
    assert "is no longer in the catalog" in table  # in the tooltip


def test_a_stage_the_resume_sweep_gave_up_on_is_shown_and_replayable(admin_client, tenant):
    anfrage = submit(tenant)
    run_stages(anfrage.id, stages=(Stage.INTAKE,))
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_jobs")
    PipelineRun.objects.create(
        tenant=tenant,
        anfrage=anfrage,
        stage="extract",
        status="failed",
        resumes=3,
        gave_up_at=timezone.now(),
        error="gave up after 3 resumes; replay it with manage.py replay_stage",
    )
    runs = reverse("admin:pipeline_pipelinerun_changelist")
    listed = admin_client.get(runs, {"resume": "gave_up"})
    assert result_count(listed) == 1 and b"failed (gave up)" in listed.content
    assert result_count(admin_client.get(runs, {"resume": "resumed"})) == 1
    board = admin_client.get(reverse("admin:pipeline_anfrage_changelist"))
    assert b"extract failed (gave up)" in board.content
    detail = admin_client.get(reverse("admin:pipeline_anfrage_change", args=[anfrage.id]))
    assert b"failed (gave up)" in detail.content

    run = PipelineRun.objects.get(anfrage=anfrage, stage="extract")
    response = admin_client.post(
        runs, {"action": "replay_stage", "_selected_action": [run.id]}, follow=True
    )
    assert messages_of(response) == [
        f"1 replay(s) queued, 0 stage(s) reset to run again: #{anfrage.id} extract"
    ]
    run.refresh_from_db()
    assert (run.resumes, run.gave_up_at, run.display_status) == (0, None, "waiting (replay)")
    assert result_count(admin_client.get(runs, {"resume": "gave_up"})) == 0
