"""The tables of agents_app: agent definitions, the index of sessions and approvals, the
approval audit, API tokens, the outbox, usage and budgets, notices and webhooks.

Dex owns the conversation; ``AgentSession`` only indexes who owns which session of which
agent (ARCHITECTURE.md "Who owns which data"). Credentials are referenced by environment
variable name (``api_key_env``), never stored.

One module past ~600 lines on purpose: it is the app's schema, one graph of tables that point
at one another (nearly all at ``AgentSession`` or ``AgentDefinition``), read in one place when
a migration is written or reviewed. Every part of the app and Django admin import the models
from ``agents_app.models``, so a package of model modules would only add an ``__init__``
re-exporting every class. It holds declarations (fields, constraints, and docstrings saying
what each column means) in the order the tables depend on one another: agents, sessions and
their search text, approvals, tokens, the outbox, usage and budgets, notices and webhooks,
inbound triggers.
The methods are a row's own (``AgentDefinition.agent_config``, the snapshot a session starts
with; ``Webhook.clean``); the logic that reads and writes the tables lives in ``selectors``,
``services``, ``sessions``, ``usage`` and ``notify``.

May import: the foundation (``conf``, ``providers``, ``webhook_urls``), ``mcp_registry.models``
and ``dex_agents`` (tests/test_layering.py).
"""

from collections.abc import Collection
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from knox.models import AbstractAuthToken
from knox.settings import CONSTANTS

from dex_agents import usd_text
from mcp_registry.models import McpTool

ENV_NAME_VALIDATOR = RegexValidator(
    r"^[A-Za-z_][A-Za-z0-9_]*$", "Enter an environment variable NAME, not a key."
)


if TYPE_CHECKING:
    from agents_app.providers import ProviderStatus


class AgentDefinition(models.Model):
    """An agent users can start sessions with: model, prompt and enabled tools.

    ``model`` is a LiteLLM model name such as ``openai/dexagents-demo``; a blank
    ``api_base`` means the provider's default endpoint.
    """

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    model = models.CharField(max_length=200, help_text="LiteLLM model, e.g. openai/gpt-4o-mini.")
    api_base = models.URLField(max_length=2000, blank=True, help_text="Blank: provider default.")
    api_key_env = models.CharField(
        max_length=200,
        blank=True,
        validators=[ENV_NAME_VALIDATOR],
        help_text="NAME of the worker environment variable holding the API key.",
    )
    system_prompt = models.TextField(blank=True)
    enabled = models.BooleanField(default=True)
    tools = models.ManyToManyField(McpTool, blank=True, related_name="agents")
    # Subagents (issue 29): other agents this one may call as ``agent__<slug>`` tools.
    subagents: "models.ManyToManyField[AgentDefinition, AgentSubagent]" = models.ManyToManyField(
        "self",
        through="AgentSubagent",
        through_fields=("parent", "child"),
        symmetrical=False,
        blank=True,
        related_name="parent_agents",
    )
    approval_deadline_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text=(
            "Seconds an approval may wait before the tool call counts as rejected. Empty: "
            "approvals wait until someone decides. A tool's own deadline overrides this."
        ),
    )
    elicitation_timeout_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text=(
            "Seconds a user may take to answer a question an MCP server asks during a tool "
            "call; unanswered, the server is told the question was cancelled. Empty: the "
            "platform default (DEXAGENTS_ELICITATION_TIMEOUT, 600)."
        ),
    )
    # Context compaction (dex_agents AgentSessionOptions.compaction); empty: the defaults.
    context_window = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(256)],
        help_text=(
            "Tokens the model accepts. Empty: LiteLLM's model information, else 32,000. Older "
            "messages are summarized before a model call that would fill 85 % of it."
        ),
    )
    message_retention_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Messages a session keeps; older ones are deleted once summarized. Empty: 2,000.",
    )
    tool_result_max_chars = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(100)],
        help_text=(
            "Characters of one tool result the model sees; the stored result stays whole. "
            "Empty: a quarter of the context window."
        ),
    )
    generate_titles = models.BooleanField(
        default=True,
        help_text=(
            "After a session's first turn, ask this agent's model for a short title (one "
            "call, off the turn's path). Off: sessions keep their first message's first line. "
            "DEXAGENTS_GENERATE_TITLES=false turns it off for every agent."
        ),
    )
    supports_images = models.BooleanField(
        null=True,
        blank=True,
        help_text=(
            "Whether the model accepts images: a tool result's images are then sent to it "
            "(within the worker's size bounds); otherwise it reads a placeholder. Empty: "
            "LiteLLM's model information (false for models it does not know)."
        ),
    )
    input_price_per_mtok = models.DecimalField(
        "input price per million tokens (USD)",
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text=(
            "Replaces LiteLLM's cost map for this agent's calls (with the output price). "
            "Empty on both: LiteLLM's price, or 0 for a model it does not know."
        ),
    )
    output_price_per_mtok = models.DecimalField(
        "output price per million tokens (USD)",
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("slug",)

    def __str__(self) -> str:
        return self.slug

    def exposed_tools(self) -> list[McpTool]:
        """The agent's tools a model may be offered: enabled and available, on enabled servers."""
        return list(
            self.tools.select_related("server")
            .filter(enabled=True, available=True, server__enabled=True)
            .order_by("server__name", "name")
        )

    def provider_status(self) -> "ProviderStatus":
        """Whether this agent's model provider can be called (its key variable is set, etc.).

        Read in the web process's environment, which is expected to match the worker's; see
        ``agents_app.providers.provider_status`` for the rules. Never raises.
        """
        from agents_app.providers import provider_status

        return provider_status(self.model, self.api_key_env or None, self.api_base or None)

    def approval_deadline_for(self, tool: McpTool) -> int | None:
        """Seconds an approval of ``tool`` may wait in this agent's sessions, or ``None``.

        The tool's own override wins over the agent's deadline.
        """
        if tool.approval_deadline_override is not None:
            return tool.approval_deadline_override
        return self.approval_deadline_seconds

    def agent_config(self, *, tool_names: Collection[str] | None = None) -> dict[str, Any]:
        """Snapshot this definition as the session's ``agent_config`` start input.

        Args:
            tool_names: Narrow the snapshot to these exposed tool names (a session may use
                fewer tools than its agent); ``None`` keeps every exposed tool. Names the agent
                does not expose are ignored here; callers validate them first.

        Returns:
            ``{"agent", "model", "api_base" (or None), "api_key_env" (or None),
            "system_prompt", "tools": [{"name" (<server>__<tool>), "server", "tool",
            "description", "parameters" (JSON Schema), "effect", "requires_approval",
            "approval_deadline_seconds" (int or None), "timeout_seconds" (the MCP request
            timeout of one call), "retries" (extra attempts of a read or idempotent_write
            call), "step_timeout_seconds" (each attempt's Dex Step limit)}]}`` (the limits are
            ``McpTool.effective_timeout``, ``effective_retries`` and ``step_timeout``), plus
            ``context_window``, ``message_retention_limit`` and ``tool_result_max_chars`` when
            set (context compaction), ``supports_images`` when set (tool results' images), and
            ``elicitation_timeout_seconds`` (this agent's, else
            ``DEXAGENTS["ELICITATION_TIMEOUT"]``: how long MCP servers' questions wait),
            and ``input_price_per_mtok`` / ``output_price_per_mtok`` as decimal strings
            when either is set (``agents_app.usage.pricing``), and ``subagents`` when it has
            any: ``[{"slug", "name" (agent__<slug>), "description"}]`` (``subagent_entries``).
            The snapshot travels in the Flow's start input, so later edits do not change
            a running session (ARCHITECTURE.md "One shared Flow").
        """
        tools = self.exposed_tools()
        if tool_names is not None:
            wanted = set(tool_names)
            tools = [tool for tool in tools if tool.exposed_name in wanted]
        config: dict[str, Any] = {
            "agent": self.slug,
            "model": self.model,
            "api_base": self.api_base or None,
            "api_key_env": self.api_key_env or None,
            "system_prompt": self.system_prompt,
            "tools": [
                {
                    "name": tool.exposed_name,
                    "server": tool.server.name,
                    "tool": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters or tool.input_schema,
                    "effect": tool.effective_effect,
                    "requires_approval": tool.effective_requires_approval,
                    "approval_deadline_seconds": self.approval_deadline_for(tool),
                    "timeout_seconds": tool.effective_timeout,
                    "retries": tool.effective_retries,
                    "step_timeout_seconds": tool.step_timeout,
                }
                for tool in tools
            ],
        }
        for name in (
            "context_window", "message_retention_limit", "tool_result_max_chars",
            "supports_images",
        ):
            value = getattr(self, name)
            if value is not None:
                config[name] = value
        if self.input_price_per_mtok is not None or self.output_price_per_mtok is not None:
            for name in ("input_price_per_mtok", "output_price_per_mtok"):
                price = getattr(self, name)
                config[name] = usd_text(Decimal(price)) if price is not None else None
        from agents_app.conf import dexagents_setting

        config["elicitation_timeout_seconds"] = self.elicitation_timeout_seconds or int(
            dexagents_setting("ELICITATION_TIMEOUT")
        )
        subagents = subagent_entries(self)
        if subagents:
            config["subagents"] = subagents
        return config


class TitleSource(models.TextChoices):
    """Where a session's title came from (``agents_app.worker.titles``)."""

    AGENT = "agent", "the agent's name (no message yet)"
    MESSAGE = "message", "its first message"
    PENDING = "pending", "its first message; a generated title is being written"
    GENERATED = "generated", "written by the agent's model"
    #: Renamed by its owner: never replaced by a generated or first-message title.
    USER = "user", "set by its owner"


class LiveSessionManager(models.Manager["AgentSession"]):
    """``AgentSession.objects``: sessions that were not deleted (``deleted_at``). Every list,
    page, API, websocket and index write reads through it, so a deleted session is unknown
    everywhere."""

    def get_queryset(self) -> "models.QuerySet[AgentSession]":
        return super().get_queryset().filter(deleted_at__isnull=True)


#: ``AgentSession.status`` of a session Dex has not reported on yet (a Dex ``AgentStatus``
#: value otherwise, or ``SESSION_STATUS_STOPPED``).
SESSION_STATUS_STARTING = "starting"
SESSION_STATUS_STOPPED = "stopped"


class AgentSession(models.Model):
    """The index row of one agent session; ``id`` is the Dex Flow ID (``ses_<uuid hex>``).

    ``status`` is the last AgentState status seen (``starting``,
    ``waiting_for_user_message``, ``running_model``, ``running_tools``,
    ``waiting_for_user_input``, ``stopped``); Dex has the truth.

    ``archived_at``: archived by its owner (hidden from lists unless asked for, still
    readable and usable). ``deleted_at``: deleted (``session_lifecycle.session_delete``): the
    row stays only as a tombstone without title, so the approval audit and usage records that
    point at it stay whole; ``objects`` leaves it out (404 everywhere), ``with_deleted`` has it.
    """

    # 255: a subagent's child session is named by Dex (``SubFlow:<parent>-<exe>-0``), so
    # nested children grow with their depth.
    id = models.CharField(primary_key=True, max_length=255, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="agent_sessions"
    )
    # Subagents (issue 29): the session whose ``agent__<slug>`` call started this one.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    parent_tool_call_id = models.CharField(max_length=255, blank=True)
    agent = models.ForeignKey(AgentDefinition, on_delete=models.PROTECT, related_name="sessions")
    title = models.CharField(max_length=200, blank=True)
    title_source = models.CharField(
        max_length=16, choices=TitleSource.choices, default=TitleSource.MESSAGE
    )
    status = models.CharField(max_length=64, default=SESSION_STATUS_STARTING)
    # When the status above was observed (worker clock or snapshot read); a status observed
    # earlier never overwrites it, so late or repeated notices cannot move it backwards.
    status_observed_at = models.DateTimeField(null=True, blank=True, editable=False)
    archived_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = LiveSessionManager()
    with_deleted = models.Manager()

    class Meta:
        ordering = ("-created_at",)
        indexes = [
            models.Index(fields=("owner", "-created_at"), name="agent_session_owner_idx"),
            models.Index(fields=("status",), name="agent_session_status_idx"),
        ]

    def __str__(self) -> str:
        return self.id


class SessionMessageText(models.Model):
    """One user or assistant message's text in the session search index (issue 27,
    "Sessions"), written by the Dex worker's session observer as it writes the session index
    (``agents_app.sessions.session_search``); keyed by session and message sequence, so a repeated
    Step attempt overwrites its row. ``text`` keeps the first ``SEARCH_TEXT_MAX_CHARS``.

    Searched through a full-text index the migration adds beside the table: an FTS5 table
    kept by triggers on SQLite, a GIN index over ``to_tsvector('simple', text)`` on
    PostgreSQL. Dex keeps the conversation; this is only what search needs.
    """

    session = models.ForeignKey(
        AgentSession, on_delete=models.CASCADE, related_name="message_texts"
    )
    sequence = models.PositiveIntegerField()
    role = models.CharField(max_length=16)
    text = models.TextField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=("session", "sequence"), name="session_message_text_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.session_id} #{self.sequence}"


class Delivery(models.TextChoices):
    """Where a write the API accepted stands on its way to Dex (ARCHITECTURE.md "Accepted
    means kept")."""

    #: Kept in Django; a Celery task delivers it once the engine and a worker answer.
    PENDING = "pending"
    #: Dex has it.
    DELIVERED = "delivered"
    #: Dex refused it (the session stopped, the tool call no longer waits); never retried.
    REFUSED = "refused"
    #: Its sender deleted or edited it before it was delivered.
    WITHDRAWN = "withdrawn"


class ApprovalDecision(models.Model):
    """The audit row of one approval decision on a tool call of a session.

    Written when staff decide, before Dex is asked (ARCHITECTURE.md "Accepted means kept"):
    ``delivery`` says whether Dex took it (``delivered``), still has to (``pending``: a Celery
    task delivers it once the engine and a worker answer) or refused it (``refused``: the call
    stopped waiting first). A decision refused while its request waited is not kept (the
    request answers 409). ``arguments`` is the tool call's JSON text exactly as the model
    produced it; ``edited_arguments`` what staff approved instead (approve with edits), blank
    when they did not edit; ``rejection_message`` is blank for approvals (seed "RPCs": an
    approval drops it). Rows outlive nothing they point at: sessions and deciders are
    protected, so users with an audit trail are deactivated rather than deleted.
    """

    session = models.ForeignKey(
        AgentSession, on_delete=models.PROTECT, related_name="approval_decisions"
    )
    interrupt_id = models.CharField(max_length=255)
    tool_call_id = models.CharField(max_length=255)
    tool_name = models.CharField(max_length=255)
    arguments = models.TextField(blank=True, help_text="JSON text, as the model produced it.")
    edited_arguments = models.TextField(
        blank=True,
        help_text="JSON text the call ran with instead, when staff edited the arguments "
        "before approving; blank: not edited.",
    )
    approved = models.BooleanField()
    rejection_message = models.TextField(blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="approval_decisions"
    )
    decided_at = models.DateTimeField(auto_now_add=True)
    # Rows written before the outbox existed were all delivered.
    delivery = models.CharField(
        max_length=16, choices=Delivery.choices, default=Delivery.DELIVERED
    )
    delivered_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ("-decided_at",)
        constraints = [
            models.UniqueConstraint(
                fields=("session", "interrupt_id"), name="approval_decision_unique_interrupt"
            )
        ]

    def __str__(self) -> str:
        verdict = "approved" if self.approved else "rejected"
        return f"{self.session_id} {self.interrupt_id} {verdict}"


class ApprovalRequest(models.Model):
    """The index row of one interrupt: a tool call of a session that waits (or waited) for a
    decision.

    Dex owns the truth (``PENDING_INTERRUPTS``); this table lets the approvals dashboard list
    every pending approval of every session with one query. The Dex worker writes a row when a
    Step raises the interrupt (before Dex commits it) and closes it when a Step consumes the
    answer, the deadline passes or the turn fails; the approvals API closes it when Dex accepts
    a decision; ``index_reconcile.session_index_reconcile`` repairs rows from Dex snapshots after
    restarts. ``interrupt_id`` is ``"<turn_id>.<tool_call_id>"`` (seed "Persistence").
    """

    class State(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        EXPIRED = "expired"
        WITHDRAWN = "withdrawn"

    session = models.ForeignKey(
        AgentSession, on_delete=models.PROTECT, related_name="approval_requests"
    )
    interrupt_id = models.CharField(max_length=255)
    tool_call_id = models.CharField(max_length=255)
    tool_name = models.CharField(max_length=255)
    arguments = models.TextField(blank=True, help_text="JSON text, as the model produced it.")
    turn_id = models.CharField(max_length=64, blank=True)
    requested_at = models.DateTimeField()
    deadline = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    # Rejection message, or why it expired or was withdrawn.
    outcome_message = models.TextField(blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("requested_at", "id")
        constraints = [
            models.UniqueConstraint(
                fields=("session", "interrupt_id"), name="approval_request_unique_interrupt"
            )
        ]
        indexes = [
            models.Index(fields=("state", "requested_at"), name="approval_request_state_idx"),
            models.Index(fields=("-closed_at",), name="approval_request_closed_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.session_id} {self.interrupt_id} {self.state}"


class ApiToken(AbstractAuthToken):
    """A named API token of one user, stored as django-rest-knox stores tokens.

    ``digest`` is the SHA-512 hex digest of the key and ``token_key`` its first 15 characters
    (the lookup index); the key itself is never stored and is shown once, when the token is
    created (``api_tokens.api_token_create``). ``expiry`` None means the token never expires.
    ``id`` is the public handle that the token list shows and ``DELETE /api/v1/tokens/<id>/``
    takes. Every lookup goes through ``agents_app.auth.user_for_token_key``.
    """

    # Replaces knox's primary key (the digest), which must not appear in URLs or lists.
    # Annotated: knox's untyped base hides the field types from django-stubs.
    id: "models.BigAutoField[int, int]" = models.BigAutoField(primary_key=True)
    digest: "models.CharField[str, str]" = models.CharField(
        max_length=CONSTANTS.DIGEST_LENGTH, unique=True
    )
    name: "models.CharField[str, str]" = models.CharField(
        max_length=100, help_text="What the token is for, e.g. 'CI deploy'."
    )

    class Meta:
        ordering = ("-created", "-id")
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.user})"


class OutboxMessage(models.Model):
    """A user message the API accepted for a session, kept until Dex has it.

    ``id`` (uuid4 hex) is also the message's ``client_id`` in Dex: ``send_user_message`` does
    not queue a ``client_id`` twice, so a redelivery after a lost answer is harmless, and the
    queue endpoints find the message by it before and after delivery. Rows are delivered per
    session, oldest first (``outbox.outbox_session_deliver``).
    """

    id = models.CharField(primary_key=True, max_length=32, editable=False)
    session = models.ForeignKey(
        AgentSession, on_delete=models.CASCADE, related_name="outbox_messages"
    )
    text = models.TextField()
    plan_mode = models.BooleanField(default=False)
    # Steer it into the running turn once delivered (asked for before delivery).
    steer = models.BooleanField(default=False)
    delivery = models.CharField(
        max_length=16, choices=Delivery.choices, default=Delivery.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("created_at", "id")
        indexes = [
            models.Index(
                fields=("session", "delivery", "created_at"), name="outbox_message_session_idx"
            ),
            models.Index(fields=("delivery", "created_at"), name="outbox_message_delivery_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.session_id} {self.id} {self.delivery}"


class OutboxTurnCancel(models.Model):
    """A turn cancel (``POST .../turn/cancel/``) the API accepted while no Dex worker
    answered, kept until Dex has it (ARCHITECTURE.md "Accepted means kept").

    ``turn_id`` is the turn the owner meant (``""``: whichever runs); the delivery names it,
    so a cancel delivered after that turn ended cannot end the next one. ``delivery``:
    ``pending`` until delivered, then ``delivered`` or ``refused`` (the turn had ended, or the
    session is gone).
    """

    session = models.ForeignKey(
        AgentSession, on_delete=models.CASCADE, related_name="outbox_turn_cancels"
    )
    turn_id = models.CharField(max_length=32, blank=True)
    delivery = models.CharField(
        max_length=16, choices=Delivery.choices, default=Delivery.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    requested_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("requested_at", "id")
        indexes = [
            models.Index(fields=("delivery", "requested_at"), name="outbox_cancel_delivery_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.session_id} cancel {self.turn_id or 'running turn'} {self.delivery}"


class UsageRecord(models.Model):
    """One model call's usage and cost, as the worker recorded it (issue 27 "Cost and usage").

    Written by the Dex worker's session observer (``agents_app.usage.usage_records``) when a
    RunModel Step reports its priced ``AgentUsage``; keyed by session and ``model_call_id``
    (the Step execution ID), so a retried Step overwrites its row instead of counting twice.
    ``owner`` and ``agent`` repeat the session's so sums per user and per agent read one table;
    ``day`` is the UTC date of the call. Dex keeps the session's own totals; these rows feed the
    sums across sessions (``GET /api/v1/usage/``, the usage page) and budgets.
    """

    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="usage")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage_records"
    )
    agent = models.ForeignKey(
        AgentDefinition, on_delete=models.PROTECT, related_name="usage_records"
    )
    model_call_id = models.CharField(max_length=255)
    turn_id = models.CharField(max_length=64, blank=True)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    reasoning_tokens = models.PositiveBigIntegerField(default=0)
    cached_input_tokens = models.PositiveBigIntegerField(default=0)
    requests = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=20, decimal_places=12, default=0)
    recorded_at = models.DateTimeField()
    day = models.DateField()

    class Meta:
        ordering = ("-recorded_at",)
        constraints = [
            models.UniqueConstraint(
                fields=("session", "model_call_id"), name="usage_record_call_unique"
            )
        ]
        indexes = [
            models.Index(fields=("owner", "day"), name="usage_record_owner_day_idx"),
            models.Index(fields=("agent", "day"), name="usage_record_agent_day_idx"),
            models.Index(fields=("day",), name="usage_record_day_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.session_id} {self.model_call_id}"


class Budget(models.Model):
    """A spending limit in US dollars per UTC day or month, for one user or one agent
    (issue 27 "Budgets"; set in admin).

    A user's budget counts that user's model calls with every agent; an agent's counts every
    user's calls with that agent (``UsageRecord`` rows). While a budget is spent, a message
    that would start a turn waits in the session's queue (``outbox.BudgetDeferred``) and a
    running turn makes no further model call (``budgets.budget_refusal``).
    """

    class Period(models.TextChoices):
        DAY = "day", "per UTC day"
        MONTH = "month", "per UTC month"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="budgets",
        help_text="Limit this user's calls with any agent. Leave empty for an agent budget.",
    )
    agent = models.ForeignKey(
        AgentDefinition,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="budgets",
        help_text="Limit every user's calls with this agent. Leave empty for a user budget.",
    )
    period = models.CharField(max_length=8, choices=Period.choices, default=Period.DAY)
    limit_usd = models.DecimalField(
        "limit (USD)", max_digits=12, decimal_places=6, validators=[MinValueValidator(0)]
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("user__username", "agent__slug", "period")
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(user__isnull=False, agent__isnull=True)
                    | models.Q(user__isnull=True, agent__isnull=False)
                ),
                name="budget_user_xor_agent",
                violation_error_message="Choose a user or an agent, not both.",
            )
        ]

    def __str__(self) -> str:
        whom = f"user {self.user}" if self.user_id else f"agent {self.agent}"
        return f"{whom}: ${self.limit_usd} {self.get_period_display()}"


class NotificationPreference(models.Model):
    """One user's choice of notices (issue 27 "Notifications"; edited in admin and with
    ``GET/PUT /api/v1/me/notifications/``).

    ``email_on_approval``: a staff user with an email address is mailed when a tool call
    starts waiting for approval, and once more before its deadline
    (``agents_app.notify.notifications``). No row means no email.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preference"
    )
    email_on_approval = models.BooleanField(
        default=False,
        help_text="Email this user (staff with an email address only) when a tool call waits "
        "for approval, and a reminder before its deadline.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.user}: {'email' if self.email_on_approval else 'no email'} on approval"


class ApprovalNotification(models.Model):
    """One email about one approval to one user: the ``requested`` notice or the
    ``reminder`` before the deadline. The unique key makes each one sent at most once
    however often the index write that asks for it repeats."""

    class Kind(models.TextChoices):
        REQUESTED = "requested"
        REMINDER = "reminder"

    request = models.ForeignKey(
        ApprovalRequest, on_delete=models.CASCADE, related_name="notifications"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="approval_notifications"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ("-created_at",)
        constraints = [
            models.UniqueConstraint(
                fields=("request", "user", "kind"), name="approval_notification_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.request_id} to {self.user}"


class WebhookEvent(models.TextChoices):
    """The events a webhook may subscribe to (README "Notifications and webhooks")."""

    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_DECIDED = "approval.decided"
    TURN_COMPLETED = "turn.completed"
    TURN_FAILED = "turn.failed"
    SESSION_STOPPED = "session.stopped"
    #: The test event admin's "Send a test event" sends (like GitHub's ping); no webhook
    #: subscribes to it.
    PING = "ping"


#: The events a webhook may subscribe to: all but ``ping``.
WEBHOOK_SUBSCRIBABLE_EVENTS: tuple[str, ...] = tuple(
    value for value in WebhookEvent.values if value != WebhookEvent.PING
)


class Webhook(models.Model):
    """An outgoing webhook registered in admin: ``events`` are POSTed to ``url`` as signed
    JSON (``agents_app.notify.webhooks``).

    ``secret`` signs every delivery (HMAC-SHA256); it is generated when the webhook is
    created, shown once in admin, masked afterwards and never logged. A URL whose host
    resolves to a private, loopback, link-local or otherwise non-public address is refused
    (``clean`` and again before each send), unless ``DEXAGENTS_WEBHOOKS_ALLOW_PRIVATE``.
    """

    name = models.CharField(max_length=100)
    url = models.URLField(max_length=2000)
    events = models.JSONField(
        default=list, help_text="Event names to send (approval.requested, ...)."
    )
    secret = models.CharField(max_length=128, editable=False)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("name", "id")

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from agents_app.webhook_urls import WebhookAddressError, webhook_url_check

        unknown = sorted(set(self.events or []) - set(WEBHOOK_SUBSCRIBABLE_EVENTS))
        if not isinstance(self.events, list) or unknown:
            raise ValidationError({"events": f"Unknown events: {', '.join(unknown)}."})
        try:
            webhook_url_check(url=self.url)
        except WebhookAddressError as error:
            raise ValidationError({"url": str(error)}) from None

    @property
    def secret_hint(self) -> str:
        """The secret masked: its prefix and last four characters only."""
        return f"whsec_…{self.secret[-4:]}" if self.secret else ""


class WebhookDelivery(models.Model):
    """One event sent (or to send) to one webhook: the delivery log (read-only in admin).

    ``key`` is the event's idempotency key (e.g. ``turn.completed:<session>:<turn>``), unique
    per webhook, so a fact reported twice is delivered once; ``event_id`` is derived from it
    and is the body's ``id``. ``payload`` is the JSON body exactly as sent.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=32, choices=WebhookEvent.choices)
    event_id = models.CharField(max_length=64)
    key = models.CharField(max_length=400)
    payload = models.TextField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at", "-id")
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.UniqueConstraint(fields=("webhook", "key"), name="webhook_delivery_unique_key")
        ]
        indexes = [
            models.Index(fields=("status", "created_at"), name="webhook_delivery_status_idx")
        ]

    def __str__(self) -> str:
        return f"{self.event} {self.event_id} to {self.webhook_id}: {self.status}"


# Issue 29, "Inbound triggers": named endpoints that start a session of an agent from an
# outside event (agents_app.api.triggers, agents_app.services.triggers).


class TriggerSignatureStyle(models.TextChoices):
    """How a trigger's deliveries are signed (``services.triggers.signature_verify``); every
    style is HMAC-SHA256 with the trigger's secret, in hex."""

    #: ``X-Dexagents-Signature: sha256=<hex of "<X-Dexagents-Timestamp>.<raw body>">``, as the
    #: platform signs its outgoing webhooks; a timestamp more than 5 minutes away is refused.
    DEXAGENTS = "dexagents", "dexagents (X-Dexagents-Signature, X-Dexagents-Timestamp)"
    #: ``X-Hub-Signature-256: sha256=<hex of the raw body>``, as GitHub signs webhooks.
    GITHUB = "github", "GitHub (X-Hub-Signature-256)"
    #: ``X-Slack-Signature: v0=<hex of "v0:<X-Slack-Request-Timestamp>:<raw body>">``, as
    #: Slack signs requests; a timestamp more than 5 minutes away is refused.
    SLACK = "slack", "Slack (X-Slack-Signature, X-Slack-Request-Timestamp)"


#: Default and largest body a trigger accepts, in bytes (the largest is Django's default
#: ``DATA_UPLOAD_MAX_MEMORY_SIZE``, 2.5 MB).
TRIGGER_DEFAULT_MAX_BODY_BYTES = 256 * 1024
TRIGGER_LARGEST_MAX_BODY_BYTES = 2_621_440


class AgentTrigger(models.Model):
    """A named inbound trigger of an agent: ``POST /api/v1/agents/<slug>/triggers/<name>/``
    with a signed JSON body starts a session of ``agent`` owned by ``run_as``, whose first
    message is ``message_template`` rendered with the body (``agents_app.trigger_templates``).

    ``secret`` signs deliveries (HMAC-SHA256, ``signature_style``); it is generated when the
    trigger is created, shown once in admin, masked afterwards and never logged.
    ``idempotency_header`` names the request header whose value identifies a delivery: a
    repeated value starts nothing and answers the first delivery's session
    (``TriggerDelivery``); without the header a delivery always starts a session, unless
    ``idempotency_required``, which refuses it (400). ``max_body_bytes`` bounds the raw body
    (413 past it).
    """

    agent = models.ForeignKey(AgentDefinition, on_delete=models.CASCADE, related_name="triggers")
    name = models.SlugField(
        max_length=64, help_text="The last part of the trigger's URL, unique per agent."
    )
    description = models.CharField(max_length=300, blank=True)
    message_template = models.TextField(
        help_text="Jinja2 (sandboxed, strict): the JSON body is `body`, e.g. "
        "`New PR {{ body.pull_request.title }} by {{ body.sender.login }}`. A field the body "
        "lacks refuses the delivery (400 naming the field)."
    )
    run_as = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="agent_triggers",
        help_text="The user who owns the sessions this trigger starts (their budgets and "
        "running-turn cap apply).",
    )
    enabled = models.BooleanField(default=True)
    signature_style = models.CharField(
        max_length=16,
        choices=TriggerSignatureStyle.choices,
        default=TriggerSignatureStyle.DEXAGENTS,
    )
    idempotency_header = models.CharField(
        max_length=100,
        default="Idempotency-Key",
        validators=[
            RegexValidator(r"^[A-Za-z0-9-]+$", "Enter an HTTP header name (letters, digits, -).")
        ],
        help_text="The header that identifies a delivery (GitHub: X-GitHub-Delivery).",
    )
    idempotency_required = models.BooleanField(
        default=False,
        help_text="Refuse deliveries without the idempotency header (400); otherwise each "
        "one starts a session.",
    )
    max_body_bytes = models.PositiveIntegerField(
        default=TRIGGER_DEFAULT_MAX_BODY_BYTES,
        validators=[
            MinValueValidator(2),
            MaxValueValidator(TRIGGER_LARGEST_MAX_BODY_BYTES),
        ],
        help_text="Largest raw body accepted, in bytes (413 past it).",
    )
    secret = models.CharField(max_length=128, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("agent__slug", "name")
        constraints = [
            models.UniqueConstraint(fields=("agent", "name"), name="agent_trigger_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.agent.slug}/{self.name}"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from agents_app.trigger_templates import TriggerTemplateError, template_check

        try:
            template_check(source=self.message_template or "")
        except TriggerTemplateError as error:
            raise ValidationError({"message_template": str(error)}) from None

    @property
    def secret_hint(self) -> str:
        """The secret masked: its prefix and last four characters only."""
        return f"trsec_…{self.secret[-4:]}" if self.secret else ""


class TriggerDelivery(models.Model):
    """One accepted delivery of a trigger and the session it started (read-only in admin).

    ``idempotency_key`` is the value of the trigger's idempotency header, unique per trigger
    when not empty: the row is written (``session`` empty) before the session starts, so of
    two concurrent deliveries with one key only one starts a session and the other answers
    with it (``services.triggers.trigger_deliver``). Deliveries without a key have ``""``.
    """

    trigger = models.ForeignKey(AgentTrigger, on_delete=models.CASCADE, related_name="deliveries")
    idempotency_key = models.CharField(max_length=200, blank=True)
    # Sessions are only tombstoned; a row goes only with its owner (a deleted user), and
    # then so does the record of what started it.
    session = models.ForeignKey(
        AgentSession, on_delete=models.CASCADE, null=True, blank=True,
        related_name="trigger_deliveries",
    )
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-received_at", "-id")
        verbose_name_plural = "trigger deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=("trigger", "idempotency_key"),
                condition=~models.Q(idempotency_key=""),
                name="trigger_delivery_unique_key",
            )
        ]

    def __str__(self) -> str:
        return f"delivery {self.idempotency_key or '(no key)'}"
# --- Subagents (issue 29) ----------------------------------------------------------------------


def subagent_entries(agent: AgentDefinition) -> list[dict[str, str]]:
    """The ``subagents`` of ``agent``'s ``agent_config`` snapshot: one
    ``{"slug", "name" (agent__<slug>), "description"}`` per enabled subagent, in ``position``
    order; the description is the link's override, else the child agent's description, else
    its name."""
    from dex_agents import subagent_tool_name

    links = (
        AgentSubagent.objects.filter(parent=agent, child__enabled=True)
        .select_related("child")
        .order_by("position", "child__slug")
    )
    return [
        {
            "slug": link.child.slug,
            "name": subagent_tool_name(link.child.slug),
            "description": (
                link.description or link.child.description or f"Ask the agent {link.child.name}."
            ),
        }
        for link in links
    ]


class AgentSubagent(models.Model):
    """One agent offered to another as a tool ``agent__<child slug>`` (issue 29).

    ``description`` overrides what the calling model reads about the child (blank: the
    child's own description). ``position`` orders the tools.
    """

    parent = models.ForeignKey(
        AgentDefinition, on_delete=models.CASCADE, related_name="subagent_links"
    )
    child = models.ForeignKey(
        AgentDefinition, on_delete=models.CASCADE, related_name="parent_links"
    )
    description = models.TextField(
        blank=True, help_text="What the calling model reads about this agent (blank: its own)."
    )
    position = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ("position", "id")
        constraints = [
            models.UniqueConstraint(fields=("parent", "child"), name="agent_subagent_unique")
        ]

    def __str__(self) -> str:
        return f"{self.parent_id} -> {self.child_id}"


# --- Schedules (issue 29, "Schedules") ----------------------------------------------------


class ScheduleTarget(models.TextChoices):
    """Where a schedule's run sends its message."""

    NEW_SESSION = "new_session", "a new session per run"
    SESSION = "session", "one persistent session"


class MissedRunPolicy(models.TextChoices):
    """What a fire that runs late (after downtime) does (``schedule_times.grace_seconds``)."""

    SKIP = "skip", "skip (record the latest missed slot as skipped)"
    RUN_ONCE = "run_once", "run once for the latest missed slot"


class Schedule(models.Model):
    """An agent that gets a message on a schedule, for its owner (issue 29, "Schedules").

    Exactly one of ``cron`` (5 fields, or 6 with seconds) and ``interval_seconds``; ``timezone``
    is the IANA zone the cron is read in (``agents_app.schedule_times``). ``target`` ``session``
    sends every run to ``session`` (created on the first run when empty; same owner and agent).
    ``message`` is plain text; ``{scheduled_for}`` (the slot, ISO 8601 in ``timezone``) and
    ``{schedule_name}`` are its only placeholders (``services.schedules.message_render``).

    ``generation`` grows on every edit, pause and resume: the Dex Flow of a schedule
    (``AgentSchedule``, flow ID ``schedule-<pk>-g<generation>``) ends when it finds the row
    gone, disabled, or at another generation, so a stale Flow never fires.
    """

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="agent_schedules"
    )
    agent = models.ForeignKey(AgentDefinition, on_delete=models.PROTECT, related_name="schedules")
    name = models.CharField(max_length=100)
    message = models.TextField(help_text="Plain text; placeholders {scheduled_for} and "
                               "{schedule_name} only (a literal brace is written twice).")
    cron = models.CharField(max_length=120, blank=True,
                            help_text="5 fields (minute hour day month weekday), or 6 with "
                            "seconds last; empty when interval_seconds is set.")
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    target = models.CharField(
        max_length=16, choices=ScheduleTarget.choices, default=ScheduleTarget.NEW_SESSION
    )
    session = models.ForeignKey(
        AgentSession, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The persistent session of target 'session' (created on the first run).",
    )
    enabled = models.BooleanField(default=True)
    missed_run_policy = models.CharField(
        max_length=16, choices=MissedRunPolicy.choices, default=MissedRunPolicy.SKIP
    )
    generation = models.PositiveIntegerField(default=1, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("name", "id")
        indexes = [models.Index(fields=("owner", "name"), name="schedule_owner_idx")]

    def __str__(self) -> str:
        return self.name


class ScheduleRunOutcome(models.TextChoices):
    """What became of one slot of a schedule."""

    STARTED = "started", "started (the session's start is being confirmed)"
    MESSAGE_SENT = "message_sent", "message sent"
    SKIPPED_MISSED = "skipped_missed", "skipped: missed while down"
    FAILED = "failed", "failed"


class ScheduleRun(models.Model):
    """One slot of a schedule that fired (or was skipped): unique per (schedule, slot), so a
    repeated fire of one slot finds its row and starts nothing new.

    ``slot`` is the nominal fire time (UTC). ``session`` is the session the run started or
    wrote to (``None`` for a skipped or failed run, or while ``started``).
    """

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="runs")
    slot = models.DateTimeField()
    session = models.ForeignKey(
        AgentSession, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    outcome = models.CharField(max_length=16, choices=ScheduleRunOutcome.choices)
    detail = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("-slot",)
        constraints = [
            models.UniqueConstraint(fields=("schedule", "slot"), name="schedule_run_unique_slot")
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} @ {self.slot.isoformat()}: {self.outcome}"
