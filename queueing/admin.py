"""The framework's admin: links from domain rows to procrastinate's jobs, and sweeps.

procrastinate registers its own job admin (``procrastinate.contrib.django``); this module
re-registers it with one more page, ``/admin/procrastinate/procrastinatejob/sweeps/``
(linked from the admin index and the job list), that lists every declared sweep, runs one
now and previews it (dry run). *Run now* queues a job sweep's singleton job for a worker
(a second press finds it waiting, and says so), and runs an inline sweep (stalled
recovery) in this process through its try-lock and clock (``queueing.sweeps.watch``), as
the workers run it: never a second recovery beside a running one, never a live worker's
job after a gap. Like the whole admin it is
staff-only; seeing it needs the view permission on procrastinate's jobs, pressing its
buttons its own permission, ``queueing.run_sweeps``.

Every write action needs a permission (:class:`ActionPermissionsMixin`): the domains'
actions the change permission of their model, procrastinate's retry, cancel and abort
the change permission on its jobs. A staff user without it does not see the action, and
posting it anyway is a 403 that writes nothing.

queueing knows no domain: each domain links its job-bearing rows with :func:`jobs_link`,
passing the singleton keys it enqueued them with, and makes its system-owned tables
read-only with :class:`ReadOnlyModelAdmin`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin import ModelAdmin, helpers
from django.contrib.auth import get_permission_codename
from django.core.exceptions import BadRequest, PermissionDenied, ValidationError
from django.db.models import F, Func, Model, Q, QuerySet, TextField, Value
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from procrastinate.contrib.django.admin import ProcrastinateJobAdmin
from procrastinate.contrib.django.models import ProcrastinateJob

from queueing.enqueue import EXCLUSIVE_PREFIX, Policy, queueing_lock_for
from queueing.exceptions import UnknownSweep
from queueing.jobs import CancelRefused, RetryOutcome, job_cancel, job_retry, unrunnable_tasks
from queueing.sweeps import (
    SWEEP_KEY,
    SWEEP_QUEUE,
    Sweep,
    SweepResult,
    get_sweep,
    request_sweep,
    run_sweep,
)
from queueing.sweeps import sweeps as declared_sweeps

if TYPE_CHECKING:
    from django.contrib.admin.filters import _ListFilterChoices  # django-stubs only
    from django.contrib.admin.views.main import ChangeList

logger = logging.getLogger(__name__)

JOB_CHANGELIST = "admin:procrastinate_procrastinatejob_changelist"
JOB_CHANGE = "admin:procrastinate_procrastinatejob_change"
#: The statuses the EXCLUSIVE policy covers: a sweep has at most one job in them.
LIVE_STATUSES = ("todo", "doing")
RUN, DRY_RUN = "run", "dry_run"


#: The permission of the Sweeps page's buttons (declared by ``queueing.models``).
RUN_SWEEPS = "queueing.run_sweeps"


class ActionPermissionsMixin(admin.ModelAdmin):
    """Admin actions guarded by permissions, refused with 403 when posted without one.

    Django leaves an action a user may not run out of the menu but silently ignores it
    when posted anyway; here that is a 403 and nothing runs. Selected ids that are not
    ids of the table are a 400. ``operate`` is the model's
    change permission, for actions declared ``@admin.action(permissions=["operate"])``
    on admins whose change form is read-only."""

    def has_operate_permission(self, request: HttpRequest) -> bool:
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}")

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        action = request.POST.get("action") if request.method == "POST" else None
        # Django's own list of the declared actions, before permissions filter it (a
        # private method, absent from the stubs).
        declared = {name for _, name, _ in self._get_base_actions()}  # type: ignore[attr-defined]
        if action in declared and action not in self.get_actions(request):
            raise PermissionDenied
        if action in declared:
            _check_selected_ids(self.opts.pk, request)
        return super().changelist_view(request, extra_context)


def _check_selected_ids(pk: Any, request: HttpRequest) -> None:
    """A posted action's selected ids must be ids of the table: Django would filter by
    them as they come and fail in the database (a 500) on ``abc`` or a NUL."""
    for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
        try:
            pk.to_python(value)
        except ValidationError:
            raise BadRequest(f"{value!r} is not an id of this table") from None


class ReadOnlyModelAdmin(ActionPermissionsMixin, admin.ModelAdmin):
    """For tables the system owns (written by services under locks and compare-and-set):
    staff look, filter and run the admin's actions, which call services; nobody adds,
    edits or deletes rows here."""

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


def jobs_url(*keys: str, policy: Policy = Policy.EXCLUSIVE) -> str:
    """procrastinate's admin job list, filtered to the jobs enqueued with any of ``keys``
    (its ``queueing_lock`` list filter; several values are OR-ed)."""
    locks = [queueing_lock_for(key, policy) for key in keys]
    return f"{reverse(JOB_CHANGELIST)}?{urlencode({'queueing_lock': locks}, doseq=True)}"


def jobs_link(*keys: str, policy: Policy = Policy.EXCLUSIVE, label: str = "jobs") -> str:
    """An HTML link to :func:`jobs_url`, for a ``list_display`` or read-only column."""
    return format_html('<a href="{}">{}</a>', jobs_url(*keys, policy=policy), label)


@dataclass(frozen=True, kw_only=True)
class SweepRow:
    sweep: Sweep
    live_job: ProcrastinateJob | None
    jobs_url: str


def _describe(name: str, result: SweepResult, *, dry_run: bool) -> str:
    if dry_run:
        return f"Sweep {name} (dry run) would select {result.selected} row(s); nothing was written."
    notes = ", ".join(f"{k}={v}" for k, v in sorted(result.notes.items()))
    return (
        f"Sweep {name} ran: selected {result.selected}, changed {result.changed}, "
        f"failed {result.failed}" + (f" ({notes})" if notes else "") + "."
    )


class RunnableFilter(admin.SimpleListFilter):
    """The waiting jobs whose task no live worker has (a worker fetches only its own
    tasks' jobs): they wait for a worker that has it, or for a cancel."""

    title = "runnable"
    parameter_name = "runnable"
    NO_WORKER = "no_worker"

    def lookups(self, request: HttpRequest, model_admin: ModelAdmin) -> list[tuple[str, str]]:
        return [(self.NO_WORKER, "waiting, no live worker takes it")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() != self.NO_WORKER:
            return queryset
        stranded = Q(pk__in=[])
        for unrunnable in unrunnable_tasks():
            stranded |= Q(task_name=unrunnable.task_name, queue_name__in=unrunnable.queues)
        return queryset.filter(stranded, status="todo")


class KindFilter(admin.SimpleListFilter):
    """The list shows the work jobs by default: the sweeps' jobs and ticks (queue
    ``sweeps``) come every few seconds and would bury them after a quiet quarter of an
    hour. A list narrowed to a queue, a task or a key, or by a search, shows what it is
    narrowed to."""

    title = "kind"
    parameter_name = "kind"
    SWEEPS, ALL = "sweeps", "all"
    #: Parameters that already say which jobs to show.
    NARROWING = ("queue_name", "task_name", "queueing_lock", "lock", "key", "runnable", "q")

    def lookups(self, request: HttpRequest, model_admin: ModelAdmin) -> list[tuple[str, str]]:
        return [(self.SWEEPS, "sweep and tick jobs"), (self.ALL, "all jobs")]

    def choices(self, changelist: ChangeList) -> Iterator[_ListFilterChoices]:
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": "work jobs (no sweeps)",
        }
        for value, label in self.lookup_choices:
            yield {
                "selected": self.value() == value,
                "query_string": changelist.get_query_string({self.parameter_name: value}),
                "display": label,
            }

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == self.SWEEPS:
            return queryset.filter(queue_name=SWEEP_QUEUE)
        # An action acts on exactly the rows it was posted for, whichever list showed them.
        if (
            self.value() == self.ALL
            or request.method != "GET"
            or any(
                name.split("__")[0] in self.NARROWING and request.GET[name] for name in request.GET
            )
        ):
            return queryset
        return queryset.exclude(queue_name=SWEEP_QUEUE)


class KeyPrefixFilter(admin.SimpleListFilter):
    """Singleton keys grouped by their first part (``extract``, ``analysis``, ``sweep``
    …): one line per kind of key instead of one per key. A single key is found with the
    search box or the rows' ``jobs`` links."""

    title = "singleton key"
    parameter_name = "key"

    def lookups(self, request: HttpRequest, model_admin: ModelAdmin) -> list[tuple[str, str]]:
        bare = Func(
            F("queueing_lock"),
            Value(f"^{EXCLUSIVE_PREFIX}"),
            Value(""),
            function="regexp_replace",
            output_field=TextField(),
        )
        prefixes = (
            ProcrastinateJob.objects.exclude(queueing_lock=None)
            .annotate(
                prefix=Func(
                    bare, Value(":"), Value(1), function="split_part", output_field=TextField()
                )
            )
            .values_list("prefix", flat=True)
            .distinct()
            .order_by("prefix")
        )
        return [(prefix, f"{prefix}:…") for prefix in prefixes]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        prefix = self.value()
        if not prefix:
            return queryset
        return queryset.filter(
            Q(queueing_lock__startswith=f"{prefix}:")
            | Q(queueing_lock__startswith=f"{EXCLUSIVE_PREFIX}{prefix}:")
        )


class JobAdmin(ActionPermissionsMixin, ProcrastinateJobAdmin):
    """procrastinate's job admin, plus the Sweeps page. Its retry and cancel go through
    the framework (``queueing.jobs``) and need the change permission on jobs: a running
    job is never retried under its live worker, a retry that a live job's key blocks
    points at that job, a cancel settles the job's domain row and is refused where nothing
    else would do the job's work. The list says which task names have waiting jobs that no
    live worker can run, and filters to them (:class:`RunnableFilter`). It lists the work
    jobs unless asked for the sweeps' (:class:`KindFilter`), and filters keys by their first
    part (:class:`KeyPrefixFilter`) or a search. procrastinate's
    *abort* is left out: a sync task cannot be interrupted, so it would only mark the job."""

    change_list_template = "admin/queueing/job_change_list.html"
    # procrastinate's queueing_lock filter lists every key ever used: grouped instead.
    list_filter = [
        KindFilter,
        RunnableFilter,
        *(
            f if f != "queueing_lock" else KeyPrefixFilter
            for f in ProcrastinateJobAdmin.list_filter
        ),
    ]
    search_fields = ["queueing_lock", "task_name"]

    class Media:
        css = {"all": ["queueing/admin.css"]}

    @admin.display(description="Args")
    def pretty_args(self, instance: ProcrastinateJob) -> str:
        """procrastinate's rendering of the job's arguments, styled by a class of
        ``queueing/admin.css`` instead of its inline ``style`` (which a strict
        Content-Security-Policy refuses)."""
        indent = 2 if len(instance.args) > 1 or len(str(instance.args)) > 30 else None
        pretty = json.dumps(instance.args, indent=indent)
        if len(pretty) > 2000:
            pretty = pretty[:2000] + "..."
        return format_html('<pre class="job-args">{}</pre>', pretty)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "GET":
            self._warn_unrunnable(request)
        return super().changelist_view(request, extra_context)

    def _warn_unrunnable(self, request: HttpRequest) -> None:
        """One line per task name whose waiting jobs no live worker can run."""
        query = urlencode({RunnableFilter.parameter_name: RunnableFilter.NO_WORKER})
        url = f"{reverse(JOB_CHANGELIST)}?{query}"
        for unrunnable in unrunnable_tasks():
            self.message_user(
                request,
                format_html(
                    "{} job(s) of task {} wait on queue(s) {}: no live worker that has this "
                    "task listens to them. They run when one starts; cancel them to give "
                    'them up. <a href="{}">Show them</a>.',
                    unrunnable.jobs,
                    unrunnable.task_name,
                    ", ".join(unrunnable.queues),
                    url,
                ),
                messages.WARNING,
            )

    def has_operate_permission(self, request: HttpRequest) -> bool:
        # procrastinate's admin answers False to every change permission (its change form
        # is read-only); its actions need the permission itself.
        return request.user.has_perm("procrastinate.change_procrastinatejob")

    @admin.action(description="Retry job (failed or stalled)", permissions=["operate"])
    def retry(self, request: HttpRequest, queryset: QuerySet[ProcrastinateJob]) -> None:
        results = [job_retry(job_id=pk) for pk in queryset.values_list("pk", flat=True)]
        done = [r for r in results if r.outcome in (RetryOutcome.RETRIED, RetryOutcome.RECOVERED)]
        if done:
            ids = ", ".join(f"#{r.job_id}" for r in done)
            self.message_user(request, f"Retried {len(done)} job(s): {ids}.", messages.SUCCESS)
        for r in results:
            if r.outcome in (RetryOutcome.RETRIED, RetryOutcome.RECOVERED):
                continue
            level = messages.INFO if r.outcome is RetryOutcome.DEDUPLICATED else messages.WARNING
            self.message_user(
                request, f"Job #{r.job_id} was not retried ({r.outcome}): {r.detail}.", level
            )

    @admin.action(description="Cancel job (waiting jobs only)", permissions=["operate"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[ProcrastinateJob]) -> None:
        actor = f"admin:{request.user.get_username()}"
        ids = list(queryset.values_list("pk", flat=True))
        cancelled = []
        for pk in ids:
            try:
                if job_cancel(job_id=pk, actor=actor):
                    cancelled.append(pk)
            except CancelRefused as exc:
                self.message_user(request, str(exc), messages.WARNING)
        self.message_user(
            request,
            f"Cancelled {len(cancelled)} of {len(ids)} job(s); only waiting jobs are "
            "cancelled, and each one's give-up hook settles the row it works on.",
            messages.SUCCESS if cancelled else messages.WARNING,
        )

    # procrastinate's class infers its `actions` as a list of callables taking a
    # ProcrastinateJobAdmin; these take this subclass, which is what Django passes them.
    actions = [retry, cancel]  # type: ignore[list-item]

    def get_urls(self):
        view = self.admin_site.admin_view(self.sweeps_view)
        # Before the model's own patterns, whose "<object_id>/" would swallow "sweeps/".
        return [path("sweeps/", view, name="queueing_sweeps"), *super().get_urls()]

    def sweeps_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        may_run = request.user.has_perm(RUN_SWEEPS)
        if request.method == "POST":
            if not may_run:
                raise PermissionDenied
            self._sweep_action(request)
            return HttpResponseRedirect(request.path)
        context = {
            **self.admin_site.each_context(request),
            "title": "Sweeps",
            "opts": self.opts,
            "rows": self._rows(),
            "may_run": may_run,
            "run": RUN,
            "dry_run": DRY_RUN,
        }
        return TemplateResponse(request, "admin/queueing/sweeps.html", context)

    def _rows(self) -> list[SweepRow]:
        rows = []
        for sweep in declared_sweeps().values():
            key = SWEEP_KEY.build(name=sweep.name)
            live = (
                ProcrastinateJob.objects.filter(
                    queueing_lock=queueing_lock_for(key, Policy.EXCLUSIVE),
                    status__in=LIVE_STATUSES,
                )
                .only("id", "status")
                .first()
            )
            rows.append(SweepRow(sweep=sweep, live_job=live, jobs_url=jobs_url(key)))
        return rows

    def _sweep_action(self, request: HttpRequest) -> None:
        name, action = request.POST.get("sweep", ""), request.POST.get("action", "")
        try:
            sweep = get_sweep(name)
        except UnknownSweep as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return
        if action == RUN and not sweep.inline:
            self._queue(request, sweep)
            return
        if action not in (RUN, DRY_RUN):
            self.message_user(request, f"Unknown sweep action {action!r}.", messages.ERROR)
            return
        dry_run = action == DRY_RUN
        try:
            result = run_sweep(sweep.name, dry_run=dry_run)
        except Exception as exc:
            # Rows are isolated inside a sweep; this is the sweep itself failing (its
            # query, say). Report it on the page rather than as a server error.
            logger.exception("sweep %s failed when run from the admin", sweep.name)
            self.message_user(
                request, f"Sweep {sweep.name} failed: {exc} (see the server log).", messages.ERROR
            )
            return
        if result is None:
            self.message_user(
                request,
                f"Sweep {sweep.name} is running right now (a worker's run holds its lock); "
                "nothing else ran.",
                messages.INFO,
            )
            return
        level = messages.WARNING if result.failed else messages.SUCCESS
        self.message_user(request, _describe(sweep.name, result, dry_run=dry_run), level)

    def _queue(self, request: HttpRequest, sweep: Sweep) -> None:
        """A job sweep runs in a worker, as its tick would run it: its singleton job,
        queued unless one is already waiting or running."""
        enqueued = request_sweep(sweep.name)
        job_url = reverse(JOB_CHANGE, args=[enqueued.job_id])
        text = (
            "Sweep {} queued for a worker as job {}."
            if enqueued.created
            else "Sweep {} is already waiting or running as job {}; nothing was queued."
        )
        link = format_html('<a href="{}">#{}</a>', job_url, enqueued.job_id)
        self.message_user(request, format_html(text, sweep.name, link), messages.SUCCESS)


admin.site.unregister(ProcrastinateJob)
admin.site.register(ProcrastinateJob, JobAdmin)
