"""OpenAPI components of a session's snapshot, conversation, tool calls and queue, for typed
clients.

These serializers only document responses (``SessionSnapshot``: ``SNAPSHOT_SCHEMA`` from
``SNAPSHOT_FIELDS``; ``MessagePage``; ``MessageQueue``); the data itself is built by
``agents_app.gateway.session_data`` (``message_to_data``, ``tool_call_to_data``, ``plain_data``
of ``dex_agents.AgentInterrupt`` and ``dex_agents.AgentUsage``) and ``agents_app.selectors``
(the snapshot's Django extras, the queue with the outbox), and
``tests/agents_app/api/test_api_session_schema.py`` checks both agree. Each becomes its own
component, named after the class without ``Serializer``, so a client generated from
``/api/schema/`` (``openapi-python-client``, tests/e2e/test_api_contract.py) reads
``snapshot.messages[-1].role`` instead of a dict.

Fields that may be absent are ``required=False`` (they are left out of the JSON, never
null); fields that may be null are ``allow_null=True``. Enumerations are the seed's own
(``dex_agents.MessageRole``, ``ToolEffect``, ``ToolCallStatus``): a new member is a contract
change of dex-agents, not something a provider or MCP server can introduce.
"""

from __future__ import annotations

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers

from dex_agents import MessageNotice, MessageRole, ToolCallStatus, ToolEffect


class MessageToolCallSerializer(serializers.Serializer):
    """A tool the model asked for, as its assistant message stored it (Chat Completions
    ``tool_calls[]``); the result is the ``tool`` message whose ``tool_call_id`` is ``id``."""

    id = serializers.CharField(
        allow_null=True, help_text="The call's ID; null only when the provider gave none."
    )
    name = serializers.CharField(allow_null=True, help_text="The tool's name.")
    arguments = serializers.CharField(
        allow_null=True, allow_blank=True,
        help_text="The arguments as JSON text, exactly as the model produced them.",
    )


class MessageReasoningSerializer(serializers.Serializer):
    """The reasoning of the model call that wrote an assistant message."""

    text = serializers.CharField(
        allow_blank=False,
        help_text="The readable reasoning summary, as the live Thinking panel showed it (never "
        "a provider's encrypted reasoning).",
    )
    seconds = serializers.FloatField(
        min_value=0, help_text="From the model call's start to its last reasoning, in seconds."
    )
    cut = serializers.BooleanField(
        required=False,
        help_text="Present (true) when text is only the first 16,000 characters.",
    )


class UsageSerializer(serializers.Serializer):
    """Token and request counts and their cost (``dex_agents.AgentUsage``)."""

    input_tokens = serializers.IntegerField(min_value=0, help_text="Cached ones included.")
    output_tokens = serializers.IntegerField(min_value=0, help_text="Reasoning ones included.")
    reasoning_tokens = serializers.IntegerField(min_value=0)
    cached_input_tokens = serializers.IntegerField(min_value=0)
    requests = serializers.IntegerField(min_value=0, help_text="Model requests made.")
    cost_usd = serializers.CharField(
        help_text="US dollars as a decimal string (e.g. \"0.000125\"): the agent's own "
        "prices, else LiteLLM's cost map; \"0\" for a model without a known price."
    )


class SessionMessageSerializer(serializers.Serializer):
    """One stored conversation message (``dex_agents.AgentMessage`` without the runner's own
    replay data)."""

    sequence = serializers.IntegerField(
        min_value=1, help_text="One-based position in the session; never reused."
    )
    role = serializers.ChoiceField(choices=[role.value for role in MessageRole])
    text = serializers.CharField(
        allow_blank=True,
        help_text="Display text: the user's message, the model's answer (empty for a message "
        "that only asks for tools) or the tool's result as text (an image is its label).",
    )
    turn_id = serializers.CharField(help_text="The turn that stored it, turn-<n>.")
    created_at = serializers.DateTimeField(
        allow_null=True,
        help_text="When it was stored (UTC); for a user message that started a turn, when it "
        "was accepted. null for a message stored before the platform kept the time.",
    )
    interrupted = serializers.BooleanField(
        required=False,
        help_text="Present (true) only on an answer the user cancelled while it streamed "
        "(POST .../turn/cancel/): text is what had arrived, and may stop mid-sentence.",
    )
    notice = serializers.ChoiceField(
        choices=[notice.value for notice in MessageNotice],
        required=False,
        help_text="Present only on a note the session stored when a turn ended early "
        "(turn_failed: the turn failed after running tools; turn_cancelled: the user "
        "cancelled it): role is then system, and text names what the turn's tool calls did.",
    )
    tool_calls = MessageToolCallSerializer(
        many=True,
        required=False,
        help_text="Assistant messages that asked for tools only: the calls, in the model's "
        "order.",
    )
    tool_call_id = serializers.CharField(
        required=False,
        help_text="Tool messages only: the call (tool_calls[].id) this is the result of.",
    )
    reasoning = MessageReasoningSerializer(
        required=False,
        help_text="Assistant messages whose model call reasoned only.",
    )
    usage = UsageSerializer(
        required=False,
        help_text="Assistant messages only: the usage and cost of the model call that "
        "produced it.",
    )
    text_length = serializers.IntegerField(
        required=False,
        min_value=0,
        help_text="Only on a message whose text is not shown whole: one too large for one "
        "answer (over about 1 MiB in a snapshot, 3 MiB in a page), whose text is then its "
        "start and a line saying how much was left out, or a tool result longer than its "
        "record keeps (1 MiB of JSON), whose text is that record's cut. The whole text's length in "
        "characters; read it whole, part by part, at GET .../messages/<sequence>/text/.",
    )


class ToolCallRecordSerializer(serializers.Serializer):
    """One tool call of the running turn (``dex_agents.AgentToolCall``): its policy, where it
    stands and its result. The records go when the turn ends; the call and its result stay in
    the conversation as messages."""

    tool_call_id = serializers.CharField()
    tool_name = serializers.CharField()
    arguments = serializers.CharField(
        allow_blank=True,
        help_text="JSON text, exactly as the model produced it; once a reviewer approved the "
        "call with edits, the edited arguments it runs with.",
    )
    original_arguments = serializers.CharField(
        allow_null=True,
        allow_blank=True,
        required=False,
        help_text="The model's arguments when a reviewer edited them before approving; null "
        "when not edited.",
    )
    subagent = serializers.BooleanField(
        required=False,
        help_text="The call runs another agent (agent__<slug>) as a child session.",
    )
    child_session_id = serializers.CharField(
        allow_null=True,
        required=False,
        help_text="A subagent call's child session, once it started: readable at "
        "/api/v1/sessions/<id>/ and on its own chat page.",
    )
    effect = serializers.ChoiceField(
        choices=[effect.value for effect in ToolEffect],
        help_text="What the tool does to the world; read and idempotent_write calls are "
        "retried, the others run at most once.",
    )
    requires_approval = serializers.BooleanField(
        help_text="Whether the call waited (or waits) for a staff member's decision."
    )
    status = serializers.ChoiceField(
        choices=[value.value for value in ToolCallStatus],
        help_text="pending, awaiting_approval and approved are open; succeeded, failed, "
        "rejected, outcome_unknown (the call may or may not have happened: a "
        "non-idempotent call cut off mid-run, or a call still open when its session was "
        "stopped) and cancelled (superseded by a steered message, or awaiting approval when "
        "the session was stopped) are final.",
    )
    deferral_order = serializers.IntegerField(
        min_value=0, help_text="Zero-based position in the model's order within the turn."
    )
    turn_id = serializers.CharField()
    output = serializers.CharField(
        allow_null=True, allow_blank=True,
        help_text="The result as text when succeeded (an image is its label); for a call "
        "cancelled by a steered message, the result the model read; else null.",
    )
    error = serializers.CharField(
        allow_null=True, allow_blank=True,
        help_text="Why it failed, or the recovery detail of outcome_unknown when there is "
        "one; else null.",
    )
    rejection_message = serializers.CharField(
        allow_null=True, allow_blank=True, help_text="The reviewer's message when rejected."
    )
    timeout_seconds = serializers.FloatField(
        allow_null=True, help_text="The tool's time limit per attempt; null: the default."
    )
    retries = serializers.IntegerField(
        allow_null=True, help_text="Attempts after the first; null: the default."
    )


class PendingInterruptSerializer(serializers.Serializer):
    """A tool call waiting for approval (``dex_agents.AgentInterrupt``); staff decide it with
    ``POST /api/v1/sessions/<id>/interrupts/<interrupt_id>/``."""

    interrupt_id = serializers.CharField(help_text="<turn_id>.<tool_call_id>")
    tool_call_id = serializers.CharField()
    tool_name = serializers.CharField()
    arguments = serializers.CharField(allow_blank=True, help_text="JSON text.")
    deadline = serializers.DateTimeField(
        allow_null=True,
        help_text="After it the call counts as rejected; null: it waits until decided.",
    )
    turn_id = serializers.CharField()


class SessionUsageSerializer(UsageSerializer):
    """The session's token and request totals and their cost over every turn
    (``dex_agents.AgentUsage``)."""


class SessionListUsageSerializer(serializers.Serializer):
    """A listed session's recorded model calls, summed (Django's usage rows, written by the
    worker as each call ends)."""

    input_tokens = serializers.IntegerField(min_value=0)
    output_tokens = serializers.IntegerField(min_value=0)
    requests = serializers.IntegerField(min_value=0)
    cost_usd = serializers.CharField(help_text="US dollars as a decimal string.")


class QueuedMessageOutputSerializer(serializers.Serializer):
    """One queued or steered message, as the queue endpoint and the snapshot list it."""

    id = serializers.CharField(
        help_text="The message's ID: the one its POST answered (32 hex characters), kept "
        "from the outbox through delivery; the queue endpoints take it."
    )
    text = serializers.CharField()
    plan_mode = serializers.BooleanField()
    created_at = serializers.DateTimeField(
        allow_null=True, help_text="When the session accepted it (null for old messages)."
    )
    delivery = serializers.ChoiceField(
        choices=["delivered", "pending"],
        help_text="pending: accepted and kept by the platform while the engine or every "
        "worker did not answer, or while a budget is spent; it joins the session's queue "
        "once delivered.",
    )
    held_reason = serializers.CharField(
        required=False,
        help_text="Only on a pending message a spent budget holds: which budget and when it "
        "resets.",
    )


DELIVERY_FIELD = serializers.ChoiceField(
    choices=["delivered", "pending"],
    help_text="delivered: the engine has it. pending: the engine or every worker did not "
    "answer; the platform keeps it and delivers it once they do.",
)


SNAPSHOT_FIELDS: dict[str, serializers.Field] = {
    "id": serializers.CharField(),
    "agent": serializers.CharField(),
    "model": serializers.CharField(),
    "title": serializers.CharField(),
    "owner": serializers.CharField(),
    "status": serializers.CharField(
        help_text="waiting_for_user_message, running_model, running_tools, "
        "waiting_for_user_input, starting before the session's first state, or stopped."
    ),
    "messages": SessionMessageSerializer(
        many=True,
        help_text="The newest retained messages, oldest first: at most 200, and as many as "
        "fit about 1 MiB (GET .../messages/ pages back through older ones).",
    ),
    "pending_interrupts": PendingInterruptSerializer(
        many=True, help_text="Tool calls waiting for a staff member's decision, oldest first."
    ),
    "awaiting_approval": serializers.BooleanField(),
    "tool_calls": ToolCallRecordSerializer(
        many=True,
        help_text="The running turn's tool calls in the model's order; empty between "
        "turns (the conversation in messages keeps every call and its result).",
    ),
    "usage": SessionUsageSerializer(help_text="Totals over every turn of the session."),
    "queued_message_count": serializers.IntegerField(),
    "queued_messages": QueuedMessageOutputSerializer(many=True),
    "steered_messages": QueuedMessageOutputSerializer(
        many=True,
        help_text="Messages steered into the running turn that its model has not seen yet.",
    ),
    "last_turn_error": serializers.CharField(allow_null=True),
    "has_older_messages": serializers.BooleanField(),
    "can_send": serializers.BooleanField(),
    "can_approve": serializers.BooleanField(),
    "events_after": serializers.CharField(
        allow_blank=True,
        help_text="AgentEvents resume token read before this snapshot ('' when none): "
        "connect /ws/sessions/<id>/events/?after=<it> to follow the session from here.",
    ),
    "live_events_after": serializers.CharField(
        allow_blank=True,
        help_text="Where a live view starts: before the running turn's turn_started, so "
        "the text it already streamed shows; events_after when no turn runs.",
    ),
    "turn_id": serializers.CharField(allow_null=True),
    "turn_mode": serializers.ChoiceField(
        choices=["chat", "planning", "executing"],
        help_text="What the running or last turn does: chat, planning (plan mode: only "
        "write_todos runs) or executing (the plan).",
    ),
    "pending_input": inline_serializer(
        "PendingUserInput",
        {
            "call_id": serializers.CharField(help_text="POST .../input/ names it."),
            "prompt": serializers.CharField(),
            "choices": serializers.ListField(
                child=serializers.CharField(), help_text="Empty for a free-text answer."
            ),
        },
        allow_null=True,
        help_text="The question the model asked (request_user_input), or null.",
    ),
    "pending_elicitations": inline_serializer(
        "PendingElicitation",
        {
            "kind": serializers.ChoiceField(choices=["elicitation"]),
            "elicitation_id": serializers.CharField(
                help_text="POST .../elicitations/<elicitation_id>/ answers it."
            ),
            "call_id": serializers.CharField(help_text="The tool call that asks."),
            "tool_name": serializers.CharField(),
            "server": serializers.CharField(help_text="The MCP server that asks."),
            "mode": serializers.ChoiceField(
                choices=["form", "url"],
                help_text="form: fill requested_schema; url: open url yourself, then "
                "answer accept (done), decline or cancel.",
            ),
            "message": serializers.CharField(help_text="The server's text for the user."),
            "requested_schema": serializers.DictField(
                allow_null=True,
                help_text="The form (MCP's restricted JSON Schema: a flat object of string, "
                "number, integer, boolean and enum properties, with required); null in "
                "URL mode.",
            ),
            "field_order": serializers.ListField(
                child=serializers.CharField(),
                help_text="The form's property names in the server's order (empty in URL "
                "mode); a JSON reader may not keep the order of requested_schema's keys.",
            ),
            "url": serializers.CharField(allow_null=True, help_text="URL mode only."),
            "requested_at": serializers.DateTimeField(),
            "deadline": serializers.DateTimeField(
                help_text="Unanswered by then, the server is told the question was "
                "cancelled."
            ),
        },
        many=True,
        help_text="Questions MCP servers ask during the running turn's tool calls, oldest "
        "first; each call waits for its answer.",
    ),
    "pending_timer": inline_serializer(
        "PendingTimer",
        {
            "call_id": serializers.CharField(),
            "fires_at": serializers.DateTimeField(),
            "duration_seconds": serializers.IntegerField(),
            "reason": serializers.CharField(),
        },
        allow_null=True,
        help_text="The running durable_wait, or null; steering a message ends it early.",
    ),
    "plan": inline_serializer(
        "SessionPlan",
        {
            "revision": serializers.IntegerField(),
            "status": serializers.ChoiceField(choices=["draft", "active", "completed"]),
            "tasks": inline_serializer(
                "PlanTask",
                {
                    "content": serializers.CharField(),
                    "status": serializers.ChoiceField(
                        choices=["pending", "in_progress", "completed"]
                    ),
                },
                many=True,
            ),
        },
        allow_null=True,
        help_text="The session's plan (null before the first one and once cleared).",
    ),
    "plan_execution_requested": serializers.BooleanField(
        help_text="POST .../plan/execute/ was accepted and its turn has not started yet."
    ),
    "summary": inline_serializer(
        name="ContextSummary",
        fields={
            "through_sequence": serializers.IntegerField(),
            "text": serializers.CharField(),
            "generation": serializers.IntegerField(),
            "first_retained_sequence": serializers.IntegerField(),
        },
        allow_null=True,
        help_text="Context compaction: the summary of messages 1..through_sequence the "
        "model sees instead of them; messages before first_retained_sequence were deleted. "
        "null until a compaction ran.",
    ),
}
SNAPSHOT_SCHEMA = inline_serializer(name="SessionSnapshot", fields=SNAPSHOT_FIELDS)
