"""The dashboard: login, the user's analyses with positions, runs panel, stage board,
the submit form, and isolation between users and tenants."""

from __future__ import annotations

import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test import Client

from config.templatetags.timestamps import ago, stamp
from pipeline.models import Anfrage, AnfrageFile
from pipeline.stages import Stage
from runs.admission import analysis_job_admit
from runs.models import AnalysisJob, CreditEntry, JobStatus, SavedBy
from tests.site.conftest import (
    DOC_HTML,
    SOURCE,
    admit,
    funded_user,
    inquiry,
    process,
    run_row,
    stage_run,
)

pytestmark = pytest.mark.django_db


def form_data(**overrides) -> dict[str, str]:
    data = {
        "title": "From the form",
        "doc_html": DOC_HTML,
        "source_key": SOURCE["key"],
        "source_title": SOURCE["title"],
        "source_doi": SOURCE["doi"],
        "source_text": SOURCE["text"],
    }
    return data | overrides


def test_anonymous_is_sent_to_the_login_page(client):
    response = client.get("/dashboard/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
    assert client.get("/accounts/login/").status_code == 200


def test_login_form_leads_to_the_dashboard(client, alice):
    response = client.post("/accounts/login/", {"username": "alice", "password": "pw"})
    assert response.status_code == 302
    assert response["Location"] == "/dashboard/"
    assert client.get("/dashboard/").status_code == 200


def test_running_and_queued_analyses_with_positions(client, alice):
    first, second, third = (admit(alice, f"doc {i}") for i in range(3))
    client.force_login(alice)
    response = client.get("/dashboard/")
    assert response.status_code == 200
    ctx = response.context
    assert [r.job.pk for r in ctx["running"]] == [first.pk]
    assert [(r.job.pk, r.position) for r in ctx["queued"]] == [(second.pk, 1), (third.pk, 2)]
    assert ctx["in_flight"] is True
    body = response.content.decode()
    assert 'data-in-flight="true"' in body
    assert re.search(rf'<tr id="job-{second.pk}"[^>]* data-status="queued"', body)
    assert f'href="/dashboard/analyses/{second.pk}"' in body


def test_finished_work_stops_the_refresh_and_unsaved_runs_are_marked(client, alice):
    job = process(admit(alice, "done"))
    assert job.status == JobStatus.COMPLETE
    client.force_login(alice)
    response = client.get("/dashboard/")
    body = response.content.decode()
    assert response.context["in_flight"] is False
    assert 'data-in-flight="false"' in body
    assert f'data-unsaved-job="{job.pk}"' in body
    assert "1 supported" in body

    # The page's script saves it through the API with the session (CSRF-checked).
    csrf_client = client.__class__(enforce_csrf_checks=True)
    csrf_client.force_login(alice)
    page = csrf_client.get("/dashboard/")
    token = page.cookies["csrftoken"].value
    saved = csrf_client.post(
        "/api/analysis-runs",
        {"job_id": job.pk},
        content_type="application/json",
        headers={"X-CSRFToken": token},
    )
    assert saved.status_code == 201, saved.content
    body = csrf_client.get("/dashboard/").content.decode()
    assert f'data-unsaved-job="{job.pk}"' not in body
    assert 'class="badge client"' in body


def test_runs_panel_is_newest_first(client, alice):
    run_row(alice, title="older run", saved_by=SavedBy.WORKER)
    run_row(alice, title="newer run", saved_by=SavedBy.CLIENT)
    client.force_login(alice)
    response = client.get("/dashboard/")
    assert [r.title for r in response.context["runs"]] == ["newer run", "older run"]
    body = response.content.decode()
    assert body.index("newer run") < body.index("older run")


def test_stage_board_shows_stage_attempts_error_and_quote(client, alice, tenant):
    anfrage = inquiry(tenant, "Steel beams", quote="1234.50")
    stage_run(anfrage, "intake", "success", seconds=1)
    stage_run(anfrage, "extract", "failed", seconds=1, attempts=3, error="parser exploded")
    client.force_login(alice)
    response = client.get("/dashboard/")
    body = response.content.decode()
    assert "Steel beams" in body
    assert "1234.50 EUR" in body
    assert 'data-stage="extract" data-status="failed"' in body
    assert "3 attempts" in body
    assert "parser exploded" in body
    assert 'data-stage="calculate" data-status="pending"' in body
    # A failed stage is not in flight: the page stops refreshing.
    assert response.context["in_flight"] is False


def test_only_own_rows_are_shown(client, alice, mallory, tenant, other_tenant):
    colleague = funded_user(tenant, "bob")
    admit(mallory, "FOREIGN-ANALYSIS")
    admit(colleague, "COLLEAGUE-ANALYSIS")
    run_row(mallory, title="FOREIGN-RUN", saved_by=SavedBy.CLIENT)
    run_row(colleague, title="COLLEAGUE-RUN", saved_by=SavedBy.CLIENT)
    inquiry(other_tenant, "FOREIGN-INQUIRY")
    inquiry(tenant, "OWN-INQUIRY")
    client.force_login(alice)
    body = client.get("/dashboard/").content.decode()
    for foreign in (
        "FOREIGN-ANALYSIS",
        "COLLEAGUE-ANALYSIS",
        "FOREIGN-RUN",
        "COLLEAGUE-RUN",
        "FOREIGN-INQUIRY",
    ):
        assert foreign not in body
    # Inquiries belong to the tenant, so a colleague's are visible.
    assert "OWN-INQUIRY" in body


def test_submit_form_admits_an_analysis(client, alice):
    client.force_login(alice)
    response = client.post("/dashboard/analyses", form_data(), follow=True)
    assert response.status_code == 200
    job = AnalysisJob.objects.get(user=alice)
    assert job.title == "From the form"
    assert job.status == JobStatus.PENDING
    assert job.sources[0]["key"] == "thermo"
    assert f"Analysis #{job.pk} admitted, starting now." in response.content.decode()

    second = client.post("/dashboard/analyses", form_data(title="Second"), follow=True)
    assert "queued at position 1" in second.content.decode()


def test_submit_form_rejects_bad_input_and_writes_nothing(client, alice):
    client.force_login(alice)
    entries = CreditEntry.objects.count()
    response = client.post("/dashboard/analyses", form_data(source_key="bad key!"))
    assert response.status_code == 400
    response = client.post("/dashboard/analyses", form_data(doc_html="<p>no citations</p>"))
    assert response.status_code == 400
    assert "no citations" in response.content.decode().lower()
    assert not AnalysisJob.objects.exists()
    assert CreditEntry.objects.count() == entries


def test_submit_without_credits_is_402(client, tenant):
    broke = funded_user(tenant, "broke", credits=0)
    client.force_login(broke)
    response = client.post("/dashboard/analyses", form_data())
    assert response.status_code == 402
    assert "grant_credits" in response.content.decode()
    assert not AnalysisJob.objects.exists()


def test_user_without_tenant_gets_a_clear_page(client, django_user_model):
    admin = django_user_model.objects.create_user(username="root", password="pw")
    client.force_login(admin)
    response = client.get("/dashboard/")
    assert response.status_code == 403
    assert "No tenant" in response.content.decode()
    assert client.post("/dashboard/analyses", form_data()).status_code == 403
    assert not AnalysisJob.objects.exists()


def test_logout(client, alice):
    client.force_login(alice)
    response = client.post("/accounts/logout/")
    assert response.status_code == 302
    assert client.get("/dashboard/").status_code == 302


def test_only_the_newest_job_of_a_run_is_marked_for_the_client_save(client, alice):
    first = process(admit(alice, "first"))
    delta = analysis_job_admit(
        user=alice,
        title="re-check",
        doc_html=DOC_HTML,
        sources=[SOURCE],
        delta_of_job_id=first.pk,
    )
    delta_job = process(AnalysisJob.objects.get(pk=delta.id))
    assert delta_job.run_id == first.run_id and delta_job.status == JobStatus.COMPLETE
    client.force_login(alice)
    body = client.get("/dashboard/").content.decode()
    assert f'data-unsaved-job="{delta_job.pk}"' in body
    assert f'data-unsaved-job="{first.pk}"' not in body


def test_analysis_detail_page_shows_verdicts_and_save_state(client, alice):
    job = process(admit(alice, "Boiling"))
    client.force_login(alice)
    page = client.get(f"/dashboard/analyses/{job.pk}")
    assert page.status_code == 200
    body = page.content.decode()
    assert f"Analysis #{job.pk} Boiling" in body
    assert 'data-newest="true"' in body and 'data-saved="false"' in body
    assert "1 supported" in body
    assert '<span class="badge verdict supported">supported</span>' in body
    assert "/static/pgstage/dashboard." in body


def test_inquiry_detail_page_shows_stages_with_times_and_errors(client, alice, tenant):
    anfrage = inquiry(tenant, "Steel beams", quote="1234.50")
    stage_run(anfrage, "intake", "success", seconds=1.5)
    stage_run(anfrage, "extract", "failed", seconds=1, attempts=2, error="parser exploded")
    client.force_login(alice)
    page = client.get(f"/dashboard/inquiries/{anfrage.pk}")
    assert page.status_code == 200
    body = page.content.decode()
    assert re.search(r'id="stage-intake"[^>]* data-status="success"', body)
    assert "1.50 s" in body
    assert "parser exploded" in body
    assert 'data-in-flight="false"' in body
    assert "1234.50 EUR" in body


def test_detail_pages_of_other_tenants_and_users_are_404(client, alice, mallory, other_tenant):
    foreign_job = admit(mallory, "theirs")
    foreign_inquiry = inquiry(other_tenant, "theirs")
    client.force_login(alice)
    assert client.get(f"/dashboard/analyses/{foreign_job.pk}").status_code == 404
    assert client.get(f"/dashboard/inquiries/{foreign_inquiry.pk}").status_code == 404
    assert client.get("/dashboard/analyses/999999").status_code == 404


def test_upload_form_submits_an_inquiry_and_goes_to_its_page(client, alice):
    client.force_login(alice)
    upload = SimpleUploadedFile("beams.txt", b"12 pcs steel beam HEA 200, 6 m\n", "text/plain")
    response = client.post("/dashboard/inquiries", {"title": "Beams", "files": [upload]})
    anfrage = Anfrage.objects.get(tenant=alice.tenant)
    assert response.status_code == 302
    assert response["Location"] == f"/dashboard/inquiries/{anfrage.pk}"
    assert anfrage.title == "Beams"
    page = client.get(response["Location"])
    assert f"Inquiry #{anfrage.pk} submitted" in page.content.decode()
    # The page's script removes the message once this inquiry's pipeline finished.
    assert f'data-watch="anfrage:{anfrage.pk}"' in page.content.decode()
    assert 'data-in-flight="true"' in page.content.decode()


def test_upload_form_refuses_bad_files_and_writes_nothing(client, alice):
    client.force_login(alice)
    assert client.post("/dashboard/inquiries", {"title": "none"}).status_code == 400
    binary = SimpleUploadedFile("x.txt", b"\x00\x01\x02" * 50, "text/plain")
    response = client.post("/dashboard/inquiries", {"files": [binary]})
    assert 400 <= response.status_code < 500
    assert 'id="upload-errors"' in response.content.decode()
    assert not Anfrage.objects.exists()


#: What a strict Content-Security-Policy refuses to run or apply: inline scripts, inline
#: style elements and attributes, inline event handlers.
INLINE = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>|<style\b|\sstyle=|\son[a-z]+=", re.I)


def test_every_page_carries_the_policy_and_nothing_inline(client, alice, tenant, admin_client):
    job = admit(alice, "T")
    anfrage = inquiry(tenant, "Beams")
    client.force_login(alice)
    pages = [
        (client, "/dashboard/"),
        (client, f"/dashboard/inquiries/{anfrage.pk}"),
        (client, f"/dashboard/analyses/{job.pk}"),
        (admin_client, "/admin/"),
        (admin_client, "/admin/runs/analysisjob/"),
        (admin_client, "/admin/pipeline/pipelinerun/"),
        (admin_client, "/admin/accounts/user/"),
        (admin_client, "/admin/procrastinate/procrastinatejob/"),
        (admin_client, "/admin/procrastinate/procrastinatejob/sweeps/"),
    ]
    anonymous = Client()
    pages.append((anonymous, "/accounts/login/"))
    pages.append((anonymous, "/admin/login/"))

    for who, url in pages:
        response = who.get(url)
        assert response.status_code == 200, url
        policy = response["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "style-src 'self'" in policy, url
        assert "'unsafe-inline'" not in policy
        assert INLINE.findall(response.content.decode()) == [], url


@pytest.fixture
def storage(settings, tmp_path):
    settings.STORAGE_ROOT = tmp_path / "storage"


def test_an_inquirys_files_download_for_its_tenant_only(client, alice, mallory, storage):
    from tests.pipeline.conftest import run_stages

    data = b"12 pcs steel beam HEA 200, 6 m\n"
    client.force_login(alice)
    client.post(
        "/dashboard/inquiries",
        {"files": [SimpleUploadedFile("hall 3 beams.txt", data, "text/plain")]},
    )
    anfrage = Anfrage.objects.get(tenant=alice.tenant)
    run_stages(anfrage.pk, stages=[Stage.INTAKE])
    stored = AnfrageFile.objects.get(anfrage=anfrage)
    url = f"/dashboard/inquiries/{anfrage.pk}/files/{stored.pk}"
    assert (
        f'href="{url}" download'
        in client.get(f"/dashboard/inquiries/{anfrage.pk}").content.decode()
    )

    response = client.get(url)
    assert response.status_code == 200
    assert response.content == data
    assert response["Content-Type"] == "text/plain"
    assert response["Content-Disposition"] == 'attachment; filename="hall 3 beams.txt"'
    other = inquiry(alice.tenant, "another of alice's")
    assert client.get(f"/dashboard/inquiries/{other.pk}/files/{stored.pk}").status_code == 404
    assert client.get(f"/dashboard/inquiries/{anfrage.pk}/files/999999").status_code == 404

    client.force_login(mallory)
    assert client.get(url).status_code == 404
    assert Client().get(url).status_code == 302  # to the login page


def test_analysis_page_shows_the_document_and_links_its_run(client, alice):
    job = admit(alice, "T")
    client.force_login(alice)
    body = client.get(f"/dashboard/analyses/{job.pk}").content.decode()
    document = re.search(r'<pre class="doc">(.*?)</pre>', body, re.S).group(1)
    assert document == DOC_HTML.replace("<", "&lt;").replace(">", "&gt;")
    assert re.search(
        rf'href="/dashboard/analyses/{job.pk}" id="run-link"[^>]*><code>{job.run_id}</code>', body
    )


def register_worker(*, age_seconds: float) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO procrastinate_workers (last_heartbeat) "
            "VALUES (now() - make_interval(secs => %s))",
            [age_seconds],
        )


def test_the_pages_say_when_no_worker_is_alive(client, alice, settings):
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_workers")
    client.force_login(alice)
    notice = re.compile(r'<p class="notice warn" id="no-worker"[^>]*>')

    assert "hidden" not in notice.search(client.get("/dashboard/").content.decode()).group()
    assert client.get("/dashboard/workers").json()["alive"] is False
    register_worker(age_seconds=settings.QUEUEING_STALLED_WORKER_SECONDS + 5)
    assert "hidden" not in notice.search(client.get("/dashboard/").content.decode()).group()

    register_worker(age_seconds=1)
    assert "hidden" in notice.search(client.get("/dashboard/").content.decode()).group()
    state = client.get("/dashboard/workers").json()
    assert state["alive"] is True
    assert state["threshold_seconds"] == settings.QUEUEING_STALLED_WORKER_SECONDS
    assert Client().get("/dashboard/workers").status_code == 302


def test_times_read_with_date_zone_and_one_relative_style():
    import datetime

    now = datetime.datetime(2026, 12, 1, 19, 5, 30, tzinfo=datetime.UTC)
    berlin = datetime.timezone(datetime.timedelta(hours=1))
    assert stamp(now.astimezone(berlin)) == "2026-12-01 19:05 UTC"
    ages = [0, 59, 60, 3599, 3600, 86399, 86400, -5]
    assert [ago(now - datetime.timedelta(seconds=s), now=now) for s in ages] == [
        "just now",
        "just now",
        "1 min ago",
        "59 min ago",
        "1 h ago",
        "23 h ago",
        "1 d ago",
        "just now",
    ]


def test_the_favicon_is_the_sites_own(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 301
    assert re.fullmatch(r"/static/pgstage/favicon(\.[0-9a-f]{12})?\.svg", response["Location"])


def test_a_stage_waiting_for_a_replay_shows_as_waiting_and_keeps_the_page_live(
    client, alice, tenant
):
    """A replay leaves its stages ``failed`` in the ledger with the replay as their reason
    until a worker claims them: the board, the inquiry page and the API say *waiting*,
    and the pages keep polling for the replay's run."""
    anfrage = inquiry(tenant, "Replayed")
    stage_run(anfrage, "intake", "success", seconds=1)
    stage_run(anfrage, "extract", "failed", error="replay requested by admin:root at now")
    client.force_login(alice)

    board = client.get("/dashboard/")
    assert 'data-stage="extract" data-status="waiting"' in board.content.decode()
    assert board.context["in_flight"] is True
    page = client.get(f"/dashboard/inquiries/{anfrage.pk}")
    assert 'data-status="waiting"' in page.content.decode()
    assert page.context["in_flight"] is True
    [listed] = client.get("/api/anfragen").json()
    shown = {s["stage"]: (s["status"], s["waiting"]) for s in listed["stages"]}
    assert shown["extract"] == ("failed", True)
    assert shown["intake"] == ("success", False)


@pytest.mark.parametrize("damage", ["missing", "changed"])
def test_a_stored_file_lost_on_disk_is_a_404_page_that_says_so(
    client, alice, storage, settings, damage, caplog
):
    from pipeline.storage import stored_path
    from tests.pipeline.conftest import run_stages

    client.force_login(alice)
    client.post(
        "/dashboard/inquiries",
        {"files": [SimpleUploadedFile("beams.txt", b"12 pcs steel beam HEA 200, 6 m\n")]},
    )
    anfrage = Anfrage.objects.get(tenant=alice.tenant)
    run_stages(anfrage.pk, stages=[Stage.INTAKE])
    stored = AnfrageFile.objects.get(anfrage=anfrage)
    path = stored_path(stored.storage_key)
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(b"not what was uploaded\n")

    response = Client(raise_request_exception=False)
    response.force_login(alice)
    response = response.get(f"/dashboard/inquiries/{anfrage.pk}/files/{stored.pk}")

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert "beams.txt" in page and "stored copy" in page
    assert "not what was uploaded" not in page
    assert any(
        r.levelname == "ERROR" and stored.storage_key in r.getMessage() for r in caplog.records
    )
