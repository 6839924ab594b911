"""Indexes fewer for the analyses' writes to maintain, each covered by another. Three on
every admission:

* ``credit_ledger (job_id)``: ``credit_ledger_once_per_job`` on ``(job_id, kind)``;
* ``core_daily_usage (tenant_id)``: ``core_daily_usage_tenant_day_uq`` on ``(tenant_id,
  day)``;
* ``analysis_jobs (delta_of_job_id)``: now ``analysis_jobs_delta_idx``, partial on the
  deltas alone (a first-pass job, which every admission inserts, has none);

and three more: ``job_citations (job_id)`` (``job_citations_marker_once``),
``run_judgements (run_id)`` (``run_judgements_once``) and ``analysis_audit (tenant_id)``
(``analysis_audit_tenant_idx``).

The partial index is built first and each old one dropped after, all without blocking
the tables' writes (``CONCURRENTLY``); a build that failed part-way leaves an invalid index
of its name, which the next run drops first (as ``runs.0008``). The foreign keys' lookups
(a protected delete's check) use the covering indexes."""

from django.db import migrations, models
from django.db.models.deletion import CASCADE, PROTECT

from queueing.indexes import drop_index, drop_invalid_index

DELTA = "analysis_jobs_delta_idx"
#: Django's names for the FK indexes it made (``runs.0001``, ``runs.0005``, ``runs.0006``).
DROPPED = {
    "credit_ledger_job_id_d25c54f1": "credit_ledger (job_id)",
    "core_daily_usage_tenant_id_20d2e2fd": "core_daily_usage (tenant_id)",
    "analysis_jobs_delta_of_job_id_3b0c5dd4": "analysis_jobs (delta_of_job_id)",
    "job_citations_job_id_ec871e71": "job_citations (job_id)",
    "run_judgements_run_id_b1589160": "run_judgements (run_id)",
    "analysis_audit_tenant_id_3439ecd8": "analysis_audit (tenant_id)",
}


class Migration(migrations.Migration):
    atomic = False
    dependencies = [
        ("accounts", "0003_api_token_label"),
        ("runs", "0012_credit_ledger_guards"),
    ]

    operations = [
        drop_invalid_index(DELTA),
        # IF NOT EXISTS: a run that built the index and failed on a drop after it runs
        # again from here.
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {DELTA} ON analysis_jobs "
                    "(delta_of_job_id) WHERE delta_of_job_id IS NOT NULL",
                    f"DROP INDEX CONCURRENTLY IF EXISTS {DELTA}",
                )
            ],
            state_operations=[
                migrations.AddIndex(
                    model_name="analysisjob",
                    index=models.Index(
                        condition=models.Q(("delta_of_job__isnull", False)),
                        fields=["delta_of_job"],
                        name=DELTA,
                    ),
                )
            ],
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[drop_index(name, on=on) for name, on in DROPPED.items()],
            state_operations=[
                migrations.AlterField(
                    model_name="analysisjob",
                    name="delta_of_job",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=PROTECT,
                        related_name="deltas",
                        to="runs.analysisjob",
                    ),
                ),
                migrations.AlterField(
                    model_name="coredailyusage",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False, on_delete=CASCADE, related_name="+", to="accounts.tenant"
                    ),
                ),
                migrations.AlterField(
                    model_name="creditentry",
                    name="job",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=PROTECT,
                        related_name="+",
                        to="runs.analysisjob",
                    ),
                ),
                migrations.AlterField(
                    model_name="jobcitation",
                    name="job",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=CASCADE,
                        related_name="citations",
                        to="runs.analysisjob",
                    ),
                ),
                migrations.AlterField(
                    model_name="runjudgement",
                    name="run",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=CASCADE,
                        related_name="judgements",
                        to="runs.analysisrun",
                    ),
                ),
                migrations.AlterField(
                    model_name="analysisaudit",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False, on_delete=PROTECT, related_name="+", to="accounts.tenant"
                    ),
                ),
            ],
        ),
    ]
