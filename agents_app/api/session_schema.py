"""OpenAPI components of a session's conversation and tool calls, for typed clients.

These serializers only document responses (``SessionSnapshot`` and ``MessagePage``); the
data itself is built by ``agents_app.gateway.session_data`` (``message_to_data``,
``tool_call_to_data``, ``plain_data`` of ``dex_agents.AgentInterrupt`` and
``dex_agents.AgentUsage``), and ``tests/agents_app/api/test_api_session_schema.py`` checks both
agree. Each becomes its own component, named after the class without ``Serializer``, so a
client generated from ``/api/schema/`` (``openapi-python-client``, tests/e2e/
test_api_contract.py) reads ``snapshot.messages[-1].role`` instead of a dict.

Fields that may be absent are ``required=False`` (they are left out of the JSON, never
null); fields that may be null are ``allow_null=True``. Enumerations are the seed's own
(``dex_agents.MessageRole``, ``ToolEffect``, ``ToolCallStatus``): a new member is a contract
change of dex-agents, not something a provider or MCP server can introduce.
"""

from __future__ import annotations

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
