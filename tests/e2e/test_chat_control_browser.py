"""Control of a running turn in real Chromium (issue 27, "Done when"), against the shared page
stack (``manage.py dev``: engine, worker, web, Celery and the demo model as processes):

- **Stop generating** during a tool batch (a read that finishes, a write waiting for a staff
  approval and a running durable wait in one model response), with a message queued before;
- a budget that the first model call of a tool-using turn crosses, set and deleted by an
  administrator in Django admin, stopping the turn with a note and holding the next message;
- a webhook registered in Django admin that a local receiver gets ``approval.requested``
  from, signed with the secret admin showed once, its delivery log and the admin action
  **Send a test event**.

Personas of the shared page stack (``tests/e2e/page_stack.py``, as in ``test_pages_browser``):
``owner`` chats, ``reviewer`` (staff) reads the approvals inbox, ``admin`` (the superuser the
stack prints) works in Django admin. Each test undoes what it set (budget, prices, webhook)
and leaves no approval waiting: the stack is shared by every page module. Screenshots at
1280 and 390 px go to ``var/screenshots/``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections.abc import Iterator
from decimal import ROUND_CEILING, Decimal
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.browser import (
    NARROW,
    SCREENSHOTS,
    VIEWPORTS,
    approval_card,
    decision_row,
    log_in_to_admin,
)
from tests.e2e.conftest import wait_until
from tests.e2e.page_stack import Contexts, PageStack
from tests.e2e.test_pages_browser import (
    SLOW_WORDS,
    activity_rows,
    assistant_texts,
    region,
    screenshot,
    start_session,
    stored_messages,
    wait_for_turn_end,
)
from tests.e2e.test_usage_browser import NO_BUDGET_CODE, NO_PRICES_CODE, PRICES_CODE
from tests.webhook_receiver import Receiver, running_receiver

pytestmark = pytest.mark.e2e


def admin_page(
    contexts: Contexts, stack: PageStack, viewport: dict[str, int] | None = None
) -> Page:
    """A page logged in to Django admin as the stack's superuser ``admin``."""
    page = contexts.new(viewport).new_page()
    log_in_to_admin(page, stack.admin_password)
    return page


def send(page: Page, text: str) -> None:
    page.get_by_role("textbox", name="Message", exact=True).fill(text)
    page.get_by_role("button", name="Send").click()


def notices(page: Page) -> Any:
    return region(page, "Conversation").locator(".message-notice")


# --------------------------------------------------------------- deleted while streaming


@VIEWPORTS
def test_a_session_deleted_elsewhere_while_it_streams_ends_the_page_at_once(
    contexts: Contexts, stack: PageStack, viewport: dict[str, int]
) -> None:
    page = contexts.logged_in("owner", viewport=viewport)
    session_id = start_session(page, f"/slow 0.5\n{SLOW_WORDS}")
    response = region(page, "Response")
    expect(response).to_contain_text("You said:")
    stop = page.get_by_role("button", name="Stop generating")
    expect(stop).to_be_visible()
    path = f"/api/v1/sessions/{session_id}/"
    reads: list[str] = []  # the page's reads of the session, from the delete on
    page.on("request", lambda request: reads.append(request.url) if path in request.url else None)

    # Another tab (here the API with the owner's token) deletes it while the answer streams.
    with stack.api("owner") as api:
        assert api.delete(path).status_code == 204
    expect(page.locator("#chat-status")).to_have_text("Deleted")
    alert = page.get_by_role("alert")
    expect(alert).to_have_text("This session no longer exists.")
    expect(alert).to_be_in_viewport()
    expect(response).to_be_hidden()
    expect(stop).to_be_hidden()
    expect(page.locator("#composer-send")).to_be_hidden()
    for control in ("Stop session", "Rename", "Archive", "Delete session"):
        expect(page.get_by_role("button", name=control, exact=True)).to_be_hidden()
    expect(page.locator("#chat-status")).to_be_in_viewport()
    expect(page.locator("#dock-connection")).to_be_hidden()  # the alert says it all
    screenshot(page, "session-deleted-while-streaming", screen_too=True)

    # Focus and a network that comes back read nothing more: a request the page makes after
    # both events arrives with no read of the session before it.
    seen = len(reads)
    with page.expect_request(lambda request: "after-gone" in request.url):
        page.evaluate("""() => {
            window.dispatchEvent(new Event("focus"));
            window.dispatchEvent(new Event("online"));
            fetch("/api/v1/sessions/?after-gone=1");
        }""")
    assert reads[seen:] == [], reads
    expect(response).to_be_hidden()
    expect(page.locator("#chat-status")).to_have_text("Deleted")


# --------------------------------------------------------------- cancel during a tool batch

#: One model response, three calls at once: a read that finishes, a write that waits for a
#: staff approval, and a durable wait that is running (its Timer set) when the cancel lands.
BATCH = "\n".join([
    '/tool search__web_search {"query": "cancelled batch"}',
    '/tool slack__post_message {"channel": "general", "text": "never posted"}',
    "/wait 600 cooling off",
])
READ_LINE = 'search__web_search {"query": "cancelled batch"} -> succeeded: Search results for'
WRITE_LINE = ('slack__post_message {"channel": "general", "text": "never posted"} -> cancelled: '
              '{"status": "cancelled", "reason": "turn_cancelled_by_user"}')
WAIT_LINE = ('durable_wait {"duration_seconds": 600, "reason": "cooling off"} -> succeeded: '
             '{"status": "interrupted", "reason": "turn_cancelled_by_user"}')


@VIEWPORTS
def test_stop_generating_during_a_tool_batch_keeps_the_read_and_withdraws_the_approval(
    contexts: Contexts, stack: PageStack, viewport: dict[str, int]
) -> None:
    page = contexts.logged_in("owner", viewport=viewport)
    session_id = start_session(page, BATCH)
    activity = region(page, "Activity")
    # The read finished, the write waits for a decision, the wait runs on its Timer.
    expect(activity).to_contain_text("Tool finished search__web_search: succeeded")
    expect(region(page, "Waiting for approval")).to_contain_text("slack__post_message")
    timer = page.get_by_role("region", name=re.compile(r"^Waiting until \S"))
    expect(timer).to_contain_text("cooling off")
    expect(page.locator("#chat-status")).to_have_text("Waiting for approval")

    # Staff see the approval in the inbox.
    reviewer = contexts.logged_in("reviewer", viewport=viewport)
    reviewer.goto("/approvals/")
    card = approval_card(reviewer, session_id)
    expect(card).to_contain_text("slack__post_message")

    # A message queued before the stop waits in the queue.
    send(page, "queued before the stop")
    queue = region(page, "Message queue")
    expect(queue.locator("li")).to_have_text([re.compile("Queued.*queued before the stop")])
    stop = page.get_by_role("button", name="Stop generating")
    screenshot(page, "cancel-batch-running", screen_too=True)

    stop.click()
    # Live, never reloaded: the approval leaves the staff inbox and shows as withdrawn.
    expect(card).to_have_count(0)
    reviewer.get_by_role("tab", name="Decisions").click()
    decision = decision_row(reviewer, session_id)
    expect(decision).to_contain_text("Withdrawn")
    expect(decision).to_contain_text("turn ended")
    expect(decision).to_contain_text("slack__post_message")

    # The owner's page: the turn's end in Activity, the queued message then runs as a turn.
    expect(activity).to_contain_text("Approval withdrawn")
    expect(activity).to_contain_text("Tool finished slack__post_message: cancelled before it ran")
    expect(activity).to_contain_text("Tool finished durable_wait: interrupted")
    expect(activity).to_contain_text("Turn cancelled turn-1")
    expect(assistant_texts(page)).to_have_text(["You said: queued before the stop"])
    expect(queue.locator("li")).to_have_count(0)
    expect(queue).to_contain_text("No messages waiting.")
    expect(page.locator("#chat-status")).to_have_text("Waiting for a message")
    expect(stop).to_be_hidden()
    expect(region(page, "Waiting for approval")).to_be_hidden()
    expect(timer).to_be_hidden()
    rows = activity_rows(page)
    # The read kept its result: its finish stays listed, before the cancel.
    assert rows.index("Tool finished search__web_search: succeeded") < rows.index(
        "Turn cancelled turn-1"
    ) < rows.index("Turn started turn-2"), rows

    # Stored: the notice of the cancelled turn, the queued message's normal turn after it.
    messages = stored_messages(stack, "owner", session_id)
    assert [(m["role"], m.get("notice"), m["turn_id"]) for m in messages] == [
        ("user", None, "turn-1"), ("system", "turn_cancelled", "turn-1"),
        ("user", None, "turn-2"), ("assistant", None, "turn-2"),
    ]
    with stack.api("reviewer") as api:
        snapshot = api.get(f"/api/v1/sessions/{session_id}/").json()
        assert (snapshot["pending_interrupts"], snapshot["tool_calls"]) == ([], [])
        assert snapshot["pending_timer"] is None
        assert [item for item in api.get("/api/v1/approvals/").json()
                if item["session"] == session_id] == []

    # The note the model reads keeps each call's result: the finished read's, the approval's
    # call that never ran, the running wait the cancel ended (not blamed on a steered message).
    note = messages[1]["text"]
    for line in (READ_LINE, WRITE_LINE, WAIT_LINE):
        assert line in note, note
    assert "superseded_by_steered_user_message" not in note
    for moment in ("live", "after a reload"):
        notice = notices(page)
        expect(notice).to_have_count(1)
        expect(notice.locator(".badge-stopped")).to_have_text("Stopped")
        # People read it in plain words, one line per call, without the model's JSON.
        expect(notice).to_contain_text("This turn was cancelled. Its tool calls:")
        expect(notice.locator(".notice-calls li")).to_have_text([
            "search__web_search: ran",
            "slack__post_message: cancelled; it did not run",
            "The wait: started, then interrupted",
        ])
        expect(notice).not_to_contain_text("{")
        expect(region(page, "Conversation").locator(".message-user")).to_have_count(2)
        expect(assistant_texts(page)).to_have_text(["You said: queued before the stop"])
        expect(page.locator("#chat-status")).to_have_text("Waiting for a message")
        notice.locator(".message-meta").scroll_into_view_if_needed()
        screenshot(page, f"cancel-batch-stopped-{moment.replace(' ', '-')}", screen_too=True)
        if moment == "live":
            page.reload()

    # The next message starts a normal turn.
    send(page, "and now a normal turn")
    expect(assistant_texts(page)).to_have_text(
        ["You said: queued before the stop", "You said: and now a normal turn"]
    )
    expect(notices(page)).to_have_count(1)
    expect(page.locator("#chat-status")).to_have_text("Waiting for a message")
    assert stored_messages(stack, "owner", session_id)[-1]["turn_id"] == "turn-3"


# --------------------------------------------------------------- a budget stops a running turn

#: ``[the owner's cost today, the cost recorded for session SESSION]`` in US dollars, as the
#: budgets sum them (``UsageRecord``, which the worker writes as each model call ends).
SPENT_CODE = """
import datetime, json
from django.db.models import Sum
from agents_app.models import UsageRecord as R
today = datetime.datetime.now(datetime.UTC).date()
owner = R.objects.filter(owner__username="owner", day=today).aggregate(t=Sum("cost_usd"))["t"]
session = R.objects.filter(session_id=SESSION).aggregate(t=Sum("cost_usd"))["t"]
print(json.dumps([str(owner or 0), str(session or 0)]))
"""
#: What the first model call of a tool-using turn costs at least, at the prices of
#: ``PRICES_CODE`` ($40 per million output tokens, and such a call writes several tokens).
MARGIN_USD = Decimal("0.0001")


@pytest.fixture
def priced(stack: PageStack) -> Iterator[PageStack]:
    """The demo agent with prices, so its calls cost something a budget can count; owner
    budgets and prices are undone afterwards."""
    assert stack.shell(PRICES_CODE) == 1
    try:
        yield stack
    finally:
        stack.shell(f"{NO_BUDGET_CODE}\n{NO_PRICES_CODE}")  # one Django start for both


def budget_add_in_admin(admin: Page, *, username: str, limit_usd: Decimal) -> int:
    """Add a daily budget for ``username`` on admin's add form; return its ID."""
    admin.goto("/admin/agents_app/budget/add/")
    # The user field is admin's autocomplete (select2): search, then pick.
    admin.locator(".field-user .select2-selection").click()
    admin.locator(".select2-search__field").fill(username)
    admin.locator(".select2-results__option", has_text=re.compile(f"^{username}$")).click()
    admin.get_by_label("Period").select_option("day")
    admin.get_by_label("Limit (USD)").fill(str(limit_usd))
    admin.get_by_role("button", name="Save and continue editing").click()
    expect(admin.locator(".messagelist")).to_contain_text("was added successfully")
    found = re.search(r"/budget/(\d+)/change/", admin.url)
    assert found, admin.url
    return int(found.group(1))


@VIEWPORTS
def test_a_budget_crossed_by_a_running_turn_stops_it_with_a_note_and_holds_the_next_message(
    contexts: Contexts, priced: PageStack, viewport: dict[str, int]
) -> None:
    platform = priced
    width = viewport["width"]
    page = contexts.logged_in("owner", viewport=viewport)
    session_id = start_session(page, f"a budget at {width}")
    wait_for_turn_end(platform, "owner", session_id)
    expect(assistant_texts(page)).to_have_text([f"You said: a budget at {width}"])

    # An administrator sets the owner's daily budget just above what the owner spent today:
    # the next model call crosses it.
    with platform.api("owner") as api:
        cost = Decimal(api.get(f"/api/v1/sessions/{session_id}/").json()["usage"]["cost_usd"])
    assert cost > 0

    def spent_with_this_session() -> Decimal | None:
        owner, session = platform.shell(SPENT_CODE.replace("SESSION", repr(session_id)))
        return Decimal(owner) if Decimal(session) == cost else None

    spent = wait_until("the session's cost in the usage records", spent_with_this_session)
    # A budget's limit has six decimal places; the sum may carry more.
    limit = (spent + MARGIN_USD).quantize(Decimal("0.000001"), rounding=ROUND_CEILING)
    admin = admin_page(contexts, platform)
    budget_id = budget_add_in_admin(admin, username="owner", limit_usd=limit)

    # The page (never reloaded) sends a tool-using turn: the first call requests the search,
    # crosses the budget, and the turn stops before the search runs.
    send(page, 'over budget\n/tool search__web_search {"query": "over budget"}')
    notice = notices(page)
    expect(notice).to_have_count(1)
    refusal = re.compile(r"Budget reached: your daily budget of \$[0-9.]+ is spent")
    expect(page.locator("#chat-status")).to_have_text("Waiting for a message")
    stored = stored_messages(platform, "owner", session_id)
    assert [(m["role"], m.get("notice")) for m in stored[-2:]] == [
        ("user", None), ("system", "turn_failed")
    ], stored
    # The note the model reads names the stopped call and why it did not run.
    assert (
        'search__web_search {"query": "over budget"} -> cancelled: '
        '{"status": "cancelled", "reason": "turn_stopped"'
    ) in stored[-1]["text"], stored[-1]["text"]
    with platform.api("owner") as api:
        snapshot = api.get(f"/api/v1/sessions/{session_id}/").json()
    assert refusal.match(snapshot["last_turn_error"]), snapshot["last_turn_error"]
    # One model call for this turn (the one that crossed), none after it.
    assert snapshot["usage"]["requests"] == 2, snapshot["usage"]
    assert Decimal(snapshot["usage"]["cost_usd"]) > MARGIN_USD

    held_text = f"held at {width}"
    for moment in ("live", "after a reload"):
        # The note: the budget's sentence, that the turn stopped, the search never ran.
        expect(notice.locator(".message-role")).to_have_text("Turn failed")
        # People read it in plain words: the budget's sentence, then each call's end.
        expect(notice.locator(".message-text")).to_have_text([
            re.compile(
                r"^Budget reached: your daily budget of \$[0-9.]+ is spent \(\$[0-9.]+ used\)\. "
                r"Messages wait in the queue until midnight UTC or until an administrator "
                r"raises the budget\.$"
            ),
            "The turn was stopped after its last model call. Its tool calls:",
        ])
        expect(notice.locator(".notice-calls li")).to_have_text(
            ["search__web_search: cancelled; it did not run"]
        )
        expect(notice).not_to_contain_text("{")
        expect(page.get_by_text(re.compile(r"^The last turn failed: Budget reached: "))
               ).to_be_visible()
        expect(assistant_texts(page)).to_have_text([f"You said: a budget at {width}"])
        if moment == "live":
            expect(region(page, "Activity")).to_contain_text(
                "Tool finished search__web_search: cancelled before it ran"
            )
            notice.locator(".message-meta").scroll_into_view_if_needed()
            screenshot(page, "budget-stopped-turn", screen_too=True)
            # The next message is held in the queue with the budget's reason.
            send(page, held_text)
        queue = region(page, "Message queue")
        held = queue.locator("li").filter(has_text=held_text)
        expect(held.locator(".badge-held")).to_have_text("Held: budget spent")
        expect(held.locator(".queue-held")).to_contain_text(refusal)
        expect(queue).to_contain_text("1 message held: a budget is spent.")
        expect(page.locator("#chat-status")).to_have_text("Waiting for a message")
        if moment == "live":
            held.scroll_into_view_if_needed()
            screenshot(page, "budget-held-after-stop", screen_too=True)
            page.reload()

    # The administrator deletes the budget: the held message goes at once and runs.
    admin.goto(f"/admin/agents_app/budget/{budget_id}/delete/")
    admin.get_by_role("button", name=re.compile("^Yes, I.m sure$")).click()
    expect(admin.locator(".messagelist")).to_contain_text("was deleted successfully")
    expect(assistant_texts(page)).to_have_text(
        [f"You said: a budget at {width}", f"You said: {held_text}"], timeout=60_000
    )
    expect(region(page, "Message queue").locator("li")).to_have_count(0)
    expect(page.locator("#chat-status")).to_have_text("Waiting for a message")
    assert platform.shell(
        "import json; from agents_app.models import Budget; "
        "print(json.dumps(Budget.objects.filter(user__username='owner').count()))"
    ) == 0


# --------------------------------------------------------------- a webhook to a local receiver

WEBHOOK_NAME = "browser receiver"
WEBHOOK_DELETE_CODE = (
    "import json; from agents_app.models import Webhook; "
    f"print(json.dumps(Webhook.objects.filter(name={WEBHOOK_NAME!r}).delete()[0]))"
)


def received(receiver: Receiver, event: str, **data: Any) -> dict[str, Any]:
    """Wait until ``receiver`` got ``event`` whose ``data`` holds ``data``; the request with
    its body decoded as ``json``."""

    def probe() -> dict[str, Any] | None:
        for request in list(receiver.requests):
            body = json.loads(request["body"])
            if body["event"] == event and data.items() <= body["data"].items():
                return {**request, "json": body}
        return None

    return wait_until(f"the receiver to get {event}", probe, timeout=90)


def assert_signed(request: dict[str, Any], secret: str) -> None:
    """``X-Dexagents-Signature`` is ``sha256=`` and the hex HMAC-SHA256, keyed with
    ``secret``, of ``"<X-Dexagents-Timestamp>.<body>"``, the body byte for byte; the
    timestamp is recent. A receiver's check, written out (README "Webhooks")."""
    from agents_app.notify.webhooks import webhook_signature_verify

    headers = {name.lower(): value for name, value in request["headers"].items()}
    timestamp, signature = headers["x-dexagents-timestamp"], headers["x-dexagents-signature"]
    expected = hmac.new(secret.encode(), timestamp.encode() + b"." + request["body"],
                        hashlib.sha256).hexdigest()
    assert hmac.compare_digest(signature, f"sha256={expected}"), request
    assert abs(time.time() - int(timestamp)) < 300, timestamp
    assert headers["x-dexagents-event"] == request["json"]["event"]
    assert headers["content-type"] == "application/json"
    assert webhook_signature_verify(secret=secret, timestamp=timestamp, body=request["body"],
                                    signature=signature)
    # Another secret, or a changed body, does not verify.
    assert not webhook_signature_verify(secret=secret + "x", timestamp=timestamp,
                                        body=request["body"], signature=signature)
    assert not webhook_signature_verify(secret=secret, timestamp=timestamp,
                                        body=request["body"] + b" ", signature=signature)


def delivery_rows(admin: Page, query: str) -> Any:
    """The delivery log's rows in admin for ``query`` (``webhook__id__exact=...``)."""
    admin.goto(f"/admin/agents_app/webhookdelivery/?{query}")
    return admin.locator("#result_list tbody tr")


def test_a_webhook_registered_in_admin_delivers_signed_events_to_a_local_receiver(
    contexts: Contexts, stack: PageStack
) -> None:
    admin = admin_page(contexts, stack)
    with running_receiver() as receiver:
        try:
            # Registered in admin: the secret is shown once, in the message after saving.
            admin.goto("/admin/agents_app/webhook/add/")
            admin.get_by_label("Name").fill(WEBHOOK_NAME)
            admin.get_by_label("Url").fill(receiver.url)
            admin.get_by_label("Approval Requested").check()
            admin.get_by_label("Approval Decided").check()
            admin.get_by_role("button", name="Save", exact=True).click()
            messages = admin.locator(".messagelist")
            expect(messages).to_contain_text(f"The webhook “{WEBHOOK_NAME}” was added")
            shown = messages.get_by_text(re.compile("^Signing secret of")).inner_text()
            secret = re.search(r"(whsec_[A-Za-z0-9_-]+)$", shown.strip())
            assert secret, shown
            row = admin.locator("#result_list tbody tr").filter(has_text=WEBHOOK_NAME)
            expect(row).to_contain_text("approval.requested, approval.decided")
            # Masked from now on: only its last four characters.
            expect(row).to_contain_text(f"whsec_…{secret.group(1)[-4:]}")
            expect(row).not_to_contain_text(secret.group(1))
            screenshot(admin, "webhook-added")
            webhook_id = int(re.sub(r"\D", "", row.locator('input[name="_selected_action"]')
                                    .get_attribute("value") or ""))

            # The owner's call waits for approval: the receiver gets approval.requested.
            owner = contexts.logged_in("owner")
            session_id = start_session(
                owner, '/tool slack__post_message {"channel": "general", "text": "hooked"}'
            )
            expect(region(owner, "Waiting for approval")).to_contain_text("slack__post_message")
            requested = received(receiver, "approval.requested", session=session_id)
            assert_signed(requested, secret.group(1))
            data = requested["json"]["data"]
            assert (data["tool"], data["owner"], data["turn_id"]) == (
                "slack__post_message", "owner", "turn-1"), data
            assert requested["path"] == "/hooks/dexagents?x=1"
            assert requested["json"]["id"].startswith("evt_")

            # A staff decision is reported too (and leaves no approval waiting).
            reviewer = contexts.logged_in("reviewer")
            reviewer.goto(f"/sessions/{session_id}/")
            waiting = region(reviewer, "Waiting for approval")
            waiting.get_by_role("textbox", name="Rejection message").fill("not from a test")
            waiting.get_by_role("button", name="Reject").click()
            expect(owner.locator("#chat-status")).to_have_text("Waiting for a message")
            decided = received(receiver, "approval.decided", session=session_id)
            assert_signed(decided, secret.group(1))
            assert (decided["json"]["data"]["outcome"],
                    decided["json"]["data"]["decided_by"]) == ("rejected", "reviewer")

            # The delivery log in admin lists both, delivered with the receiver's 200.
            def logged() -> Any:
                rows = delivery_rows(admin, f"webhook__id__exact={webhook_id}")
                texts = rows.all_inner_texts()
                done = [text for text in texts if "Delivered" in text and "200" in text]
                return rows if len(done) == 2 else None

            rows = wait_until("two delivered rows in admin", logged, timeout=60)
            expect(rows.filter(has_text="Approval Requested")).to_have_count(1)
            expect(rows.filter(has_text="Approval Decided")).to_have_count(1)
            screenshot(admin, "webhook-deliveries")
            rows.filter(has_text="Approval Requested").locator("a").first.click()
            expect(admin.locator(".field-payload")).to_contain_text(session_id)
            expect(admin.locator(".field-event_id")).to_contain_text(requested["json"]["id"])

            # Admin's action "Send a test event": a signed ping, logged like every event.
            admin.goto("/admin/agents_app/webhook/")
            row = admin.locator("#result_list tbody tr").filter(has_text=WEBHOOK_NAME)
            row.locator('input[name="_selected_action"]').check()
            admin.locator('select[name="action"]').select_option(label="Send a test event")
            admin.get_by_role("button", name="Go").click()
            expect(admin.locator(".messagelist")).to_contain_text(
                f"Test event (ping) queued for {WEBHOOK_NAME}"
            )
            ping = received(receiver, "ping", webhook_id=webhook_id)
            assert_signed(ping, secret.group(1))
            assert ping["json"]["data"]["sent_by"] == "admin"
            admin.get_by_role("link", name="Webhook deliveries").last.click()

            def ping_logged() -> bool | None:
                admin.reload()
                pings = admin.locator("#result_list tbody tr").filter(has_text="Delivered")
                return pings.filter(has_text=WEBHOOK_NAME).count() >= 1 or None

            wait_until("the ping delivered in admin", ping_logged, timeout=60)
            assert "event__exact=ping" in admin.url
            screenshot(admin, "webhook-ping-delivered")
            # Admin on a phone: Django's own responsive layout, pictured, not asserted.
            phone = admin_page(contexts, stack, NARROW)
            phone.goto("/admin/agents_app/webhook/")
            expect(phone.locator("#result_list")).to_contain_text(WEBHOOK_NAME)
            phone.screenshot(path=str(SCREENSHOTS / "webhook-added-390.png"), full_page=True)
            phone.goto(f"/admin/agents_app/webhookdelivery/?webhook__id__exact={webhook_id}")
            expect(phone.locator("#result_list")).to_contain_text("Approval Requested")
            phone.screenshot(path=str(SCREENSHOTS / "webhook-deliveries-390.png"),
                             full_page=True)

            # Deleted in admin: nothing more is sent to the receiver.
            admin.goto(f"/admin/agents_app/webhook/{webhook_id}/delete/")
            admin.get_by_role("button", name=re.compile("^Yes, I.m sure$")).click()
            expect(admin.locator(".messagelist")).to_contain_text("was deleted successfully")
            assert stack.shell(WEBHOOK_DELETE_CODE) == 0
        finally:
            stack.shell(WEBHOOK_DELETE_CODE)
