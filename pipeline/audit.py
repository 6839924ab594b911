"""The inquiry's audit trail: append-only entries, each naming a row that exists."""

from __future__ import annotations

from typing import Any

from pipeline.models import AuditEntry


def audit_entry_create(
    *,
    tenant_id: int,
    entity_type: str,
    entity_id: int,
    action: str,
    actor: str,
    payload: dict[str, Any] | None = None,
) -> AuditEntry:
    """Append one audit entry (joins the caller's transaction; entries are never updated)."""
    return AuditEntry.objects.create(
        tenant_id=tenant_id,
        entity_type=entity_type,
        entity_id=entity_id,
        action=action,
        actor=actor[:150],
        payload=payload or {},
    )
