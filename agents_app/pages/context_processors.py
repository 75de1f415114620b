"""Template context every page gets (``TEMPLATES[...]["OPTIONS"]["context_processors"]``)."""

from django.http import HttpRequest

from agents_app.selectors import approval_lists


def pending_approvals(request: HttpRequest) -> dict[str, int | None]:
    """``pending_approvals_count``: how many tool calls wait for a decision, for the
    navigation's Approvals link; ``None`` for anyone who is not staff (no query is made).

    One ``COUNT`` query per staff page (``approval_lists.approval_count_pending``); the approvals
    page keeps it current live.
    """
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not user.is_staff:
        return {"pending_approvals_count": None}
    return {"pending_approvals_count": approval_lists.approval_count_pending()}
