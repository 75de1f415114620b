"""Celery tasks of the agents app; thin wrappers over services."""

import logging

from celery import shared_task

from agents_app import dex_gateway
from agents_app.session_index import session_index_reconcile

logger = logging.getLogger(__name__)


@shared_task(name="agents_app.reconcile_session_index")
def reconcile_session_index() -> dict[str, int] | None:
    """Repair the Django session and approvals index from Dex snapshots.

    django-celery-beat runs this periodically (PeriodicTask created by migration 0004,
    interval editable in admin); ``dexworker`` also runs it once at start.

    Returns:
        The counts of ``session_index.ReconcileResult``, or ``None`` when the engine did not
        answer (the next run tries again).
    """
    try:
        result = session_index_reconcile()
    except dex_gateway.EngineUnavailableError as error:
        logger.info("Index reconciliation skipped: %s", error)
        return None
    return {
        "checked": result.checked,
        "statuses": result.statuses,
        "stopped": result.stopped,
        "opened": result.opened,
        "closed": result.closed,
        "missing": result.missing,
        "unreadable": result.unreadable,
    }
