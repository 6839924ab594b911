"""The framework's admin: the Sweeps page (list, run now, dry run), procrastinate's job
list filtered by singleton keys, and who may see them.

*Run now* never runs a job sweep inside the web request: it queues the sweep's singleton
job (test_run_now_queues_a_job_sweeps_singleton_job_once). An inline sweep's (stalled
recovery) goes through the workers' try-lock and clock: after a gap it leaves a live
worker's job alone, and beside a running recovery it runs nothing
(test_run_now_of_stalled_recovery_keeps_the_clock_and_the_lock)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.urls import reverse

from queueing.admin import jobs_url
from queueing.enqueue import Policy, enqueue
from queueing.sweeps import (
    SWEEP_KEY,
    SweepContext,
    SweepResult,
    declare_sweep,
    request_sweep,
    sweep_rows,
    sweeps,
)
from tests.conftest import jobs
from tests.factories import UserFactory
from tests.queueing import tasks  # noqa: F401  (registers tests.record for enqueue)
from tests.queueing.models import Swept

pytestmark = pytest.mark.django_db

SWEEPS = "admin:queueing_sweeps"
JOB_LIST = "/admin/procrastinate/procrastinatejob/"
SELECT = """
SELECT id, boom FROM test_swept
 WHERE state = 'new'
 ORDER BY id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED"""


def mark(row) -> bool:
    row_id, boom = row
    if boom:
        raise RuntimeError("this row is broken")
    return Swept.objects.filter(pk=row_id, state="new").update(state="done") == 1


@declare_sweep(name="admin_swept", cron="*/5 * * * *", batch_size=10, grace_default=7)
def sweep_for_the_admin(ctx: SweepContext) -> SweepResult:
    """Mark 'new' test rows 'done' (the admin tests' sweep)."""
    return sweep_rows(ctx, select_sql=SELECT, params={}, process=mark)


@pytest.fixture
def staff_client(client):
    client.force_login(UserFactory(username="ops", is_staff=True, is_superuser=True))
    return client


def rows(*booms: bool) -> None:
    with connection.cursor() as cursor:
        for boom in booms:
            cursor.execute(
                "INSERT INTO test_swept (state, touched_at, boom) VALUES ('new', now(), %s)",
                [boom],
            )


def post(client, **data) -> list[str]:
    response = client.post(reverse(SWEEPS), data, follow=True)
    assert response.status_code == 200
    assert response.redirect_chain == [(reverse(SWEEPS), 302)]
    return [str(m) for m in response.context["messages"]]


def test_the_page_lists_every_declared_sweep(staff_client):
    page = staff_client.get(reverse(SWEEPS))

    assert page.status_code == 200
    listed = [row.sweep.name for row in page.context["rows"]]
    assert listed == list(sweeps()) and "admin_swept" in listed
    html = page.content.decode()
    assert "Mark &#x27;new&#x27; test rows &#x27;done&#x27;" in html
    # The cadence in words, the cron in the tooltip.
    assert '<td class="nowrap" title="cron: */5 * * * *">every 5 minutes</td>' in html
    assert "7 s" in html
    assert "every 5 seconds, in every worker" in html  # stalled recovery
    assert "none waiting" in html
    # The button is a play sign in text presentation (no emoji, no icon of Django's).
    assert "&#9654;&#xFE0E; Run now</button>" in html and "viewlink" not in html


def test_dry_run_counts_here_and_writes_nothing(staff_client):
    rows(False, False, True)

    assert post(staff_client, sweep="admin_swept", action="dry_run") == [
        "Sweep admin_swept (dry run) would select 3 row(s); nothing was written."
    ]
    assert Swept.objects.filter(state="new").count() == 3
    assert jobs(task_name="queueing.sweep.admin_swept") == []


def test_run_now_queues_a_job_sweeps_singleton_job_once(staff_client):
    rows(False)
    first = post(staff_client, sweep="admin_swept", action="run")
    second = post(staff_client, sweep="admin_swept", action="run")

    assert Swept.objects.filter(state="new").count() == 1  # not run in the request

    [job] = jobs(task_name="queueing.sweep.admin_swept")
    assert job["queueing_lock"] == "exclusive/sweep:admin_swept"
    link = f'<a href="{JOB_LIST}{job["id"]}/change/">#{job["id"]}</a>'
    assert first == [f"Sweep admin_swept queued for a worker as job {link}."]
    assert second == [
        f"Sweep admin_swept is already waiting or running as job {link}; nothing was queued."
    ]
    assert staff_client.get(f"{JOB_LIST}{job['id']}/change/").status_code == 200
    page = staff_client.get(reverse(SWEEPS))
    [row] = [r for r in page.context["rows"] if r.sweep.name == "admin_swept"]
    assert row.live_job.pk == job["id"]
    history = staff_client.get(row.jobs_url)
    assert [j.pk for j in history.context["cl"].result_list] == [job["id"]]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"sweep": "nope", "action": "run"}, "no sweep named 'nope' (known: "),
        ({"action": "run"}, "no sweep named '' (known: "),
        ({"sweep": "admin_swept", "action": "explode"}, "Unknown sweep action 'explode'."),
        ({"sweep": "admin_swept"}, "Unknown sweep action ''."),
    ],
)
def test_odd_posts_get_a_message_not_an_error(staff_client, data, message):
    [shown] = post(staff_client, **data)

    assert shown.startswith(message)
    assert jobs(task_name="queueing.sweep.admin_swept") == []


def test_a_failing_sweep_is_reported_on_the_page(staff_client, monkeypatch):
    def broken(name, **kwargs):
        raise RuntimeError("relation does not exist")

    monkeypatch.setattr("queueing.admin.run_sweep", broken)

    assert post(staff_client, sweep="admin_swept", action="dry_run") == [
        "Sweep admin_swept failed: relation does not exist (see the server log)."
    ]


def test_the_index_and_the_job_list_link_the_sweeps_page(staff_client):
    sweeps_url = reverse(SWEEPS).encode()

    assert sweeps_url in staff_client.get(reverse("admin:index")).content
    assert sweeps_url in staff_client.get(JOB_LIST).content


def test_job_list_filters_by_singleton_keys_several_at_once(staff_client):
    a = enqueue("tests.record", args={"label": "a"}, key="k:a", policy=Policy.EXCLUSIVE)
    b = enqueue("tests.record", args={"label": "b"}, key="k:b", policy=Policy.SHORT)
    enqueue("tests.record", args={"label": "c"}, key="k:c", policy=Policy.EXCLUSIVE)

    one = staff_client.get(jobs_url("k:a"))
    both = staff_client.get(
        f"{jobs_url('k:a')}&{jobs_url('k:b', policy=Policy.SHORT).split('?')[1]}"
    )

    assert jobs_url("k:a") == f"{JOB_LIST}?queueing_lock=exclusive%2Fk%3Aa"
    assert [j.pk for j in one.context["cl"].result_list] == [a.job_id]
    assert sorted(j.pk for j in both.context["cl"].result_list) == [a.job_id, b.job_id]
    assert staff_client.get(jobs_url("k:none")).context["cl"].result_count == 0


def test_sweeps_need_staff_and_the_job_view_permission(client):
    url = reverse(SWEEPS)
    assert client.get(url).status_code == 302  # anonymous: to the login page

    client.force_login(UserFactory(username="visitor"))
    response = client.post(url, {"sweep": "admin_swept", "action": "run"})
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")

    staff = UserFactory(username="clerk", is_staff=True)
    client.force_login(staff)
    assert client.get(url).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_procrastinatejob"))
    assert client.get(url).status_code == 200
    assert jobs(task_name="queueing.sweep.admin_swept") == []


def test_the_job_list_shows_jobs_no_live_worker_can_run(staff_client):
    with connection.cursor() as cursor:
        # A live worker that has tests.record, none that has tests.settled.
        cursor.execute("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
        (live,) = cursor.fetchone()
        # It listens to the default queue only.
        cursor.execute(
            "INSERT INTO pgstage_worker_tasks (worker_id, task_names, queues)"
            " VALUES (%s, ARRAY['tests.record'], '{default}')",
            [live],
        )
    runnable = enqueue("tests.record", args={"label": "runs"})
    stranded = enqueue("tests.settled", args={"label": "stranded"})
    off_queue = enqueue("tests.record", args={"label": "off"}, queue="runs")

    page = staff_client.get(JOB_LIST)
    warnings = [str(m) for m in page.context["messages"]]
    assert len(warnings) == 2
    assert "1 job(s) of task tests.record wait on queue(s) runs: no live worker" in warnings[0]
    assert (
        "1 job(s) of task tests.settled wait on queue(s) default: no live worker" in (warnings[1])
    )
    filtered = staff_client.get(f"{JOB_LIST}?runnable=no_worker")
    listed = sorted(j.pk for j in filtered.context["cl"].result_list)
    assert listed == [stranded.job_id, off_queue.job_id]
    assert runnable.job_id not in listed


def listed(client, url: str) -> list[int]:
    page = client.get(url)
    assert page.status_code == 200
    return sorted(j.pk for j in page.context["cl"].result_list)


def test_the_job_list_shows_the_work_jobs_by_default_and_sweeps_on_request(staff_client):
    work = enqueue("tests.record", args={"label": "work"}, key="k:a", policy=Policy.EXCLUSIVE)
    sweep = request_sweep("admin_swept")

    assert listed(staff_client, JOB_LIST) == [work.job_id]
    assert listed(staff_client, f"{JOB_LIST}?kind=sweeps") == [sweep.job_id]
    assert listed(staff_client, f"{JOB_LIST}?kind=all") == sorted([work.job_id, sweep.job_id])
    page = staff_client.get(JOB_LIST).content.decode()
    assert "?kind=sweeps" in page and "?kind=all" in page
    # A list narrowed to a key shows that key's jobs, a sweep's too (the Sweeps page's
    # history links).
    assert listed(staff_client, jobs_url(SWEEP_KEY.build(name="admin_swept"))) == [sweep.job_id]
    # So does a search (the docs send operators to the search box for a key or a task).
    assert listed(staff_client, f"{JOB_LIST}?q=admin_swept") == [sweep.job_id]


def test_the_key_filter_offers_key_prefixes_not_every_key(staff_client):
    jobs_by_prefix = {
        "k": [
            enqueue("tests.record", args={"label": str(i)}, key=f"k:{i}", policy=Policy.EXCLUSIVE)
            for i in range(5)
        ],
        "other": [enqueue("tests.record", args={"label": "o"}, key="other:1", policy=Policy.SHORT)],
    }
    enqueue("tests.record", args={"label": "no key"})
    page = staff_client.get(JOB_LIST)
    html = page.content.decode()

    assert "?key=k" in html and "?key=other" in html
    assert "k:3" not in html.split('id="changelist-filter"')[1]
    assert listed(staff_client, f"{JOB_LIST}?key=k") == sorted(
        e.job_id for e in jobs_by_prefix["k"]
    )
    assert listed(staff_client, f"{JOB_LIST}?key=other") == [jobs_by_prefix["other"][0].job_id]
    # A key is found by searching for it.
    assert listed(staff_client, f"{JOB_LIST}?q=k:3") == [jobs_by_prefix["k"][3].job_id]
