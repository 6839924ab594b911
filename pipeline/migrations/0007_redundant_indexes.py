"""Four tenant indexes fewer for the pipeline's writes to maintain (a stage's run row, an
extract's positions), each covered by an index that leads with the tenant:
``anfragen_tenant_created_idx``, ``audit_log_tenant_idx``,
``pipeline_runs_tenant_anfrage_stage_uq``, ``anfrage_positions_tenant_anfrage_index_uq``;
and a catalogue item's catalogue, covered by ``catalog_items_code_uq``. Dropped without blocking writes (``CONCURRENTLY``)."""

import django.db.models.deletion
from django.db import migrations, models

from queueing.indexes import drop_index

#: Django's names for the FK indexes it made (``pipeline.0001``).
DROPPED = {
    "anfragen_tenant_id_0ae2fe60": "anfragen (tenant_id)",
    "audit_log_tenant_id_73a0b482": "audit_log (tenant_id)",
    "pipeline_runs_tenant_id_65895ba8": "pipeline_runs (tenant_id)",
    "anfrage_positions_tenant_id_c9818c25": "anfrage_positions (tenant_id)",
    "catalog_items_catalog_id_4699085c": "catalog_items (catalog_id)",
}


class Migration(migrations.Migration):
    atomic = False
    dependencies = [
        ("accounts", "0003_api_token_label"),
        ("pipeline", "0006_pipelinerun_holder_job_id"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[drop_index(name, on=on) for name, on in DROPPED.items()],
            state_operations=[
                migrations.AlterField(
                    model_name="anfrage",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="anfragen",
                        to="accounts.tenant",
                    ),
                ),
                migrations.AlterField(
                    model_name="auditentry",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="accounts.tenant",
                    ),
                ),
                migrations.AlterField(
                    model_name="pipelinerun",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="accounts.tenant",
                    ),
                ),
                migrations.AlterField(
                    model_name="position",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="accounts.tenant",
                    ),
                ),
                migrations.AlterField(
                    model_name="catalogitem",
                    name="catalog",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="items",
                        to="pipeline.catalog",
                    ),
                ),
            ],
        ),
    ]
