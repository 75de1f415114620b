"""The agents app's signal receivers, connected once by ``AgentsAppConfig.ready``.

A receiver that ties two parts of the app together lives here, above both, so that neither
imports the other for it.
"""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from agents_app.models import Budget
from agents_app.sessions.outbox_holds import budget_release


@receiver(post_save, sender=Budget, dispatch_uid="budget_saved")
@receiver(post_delete, sender=Budget, dispatch_uid="budget_deleted")
def budget_changed(sender: type[Budget], instance: Budget, **kwargs: Any) -> None:
    """A budget was saved (raised, lowered, disabled) or deleted, in admin or elsewhere:
    queue the delivery of the messages held for a budget in the sessions it covers (its
    user's, or its agent's), once the change commits (``outbox_holds.budget_release``).
    Messages another budget still holds stay pending with that budget's reason."""
    budget_release(owner_id=instance.user_id, agent_id=instance.agent_id)
