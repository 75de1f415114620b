"""``AgentSessionFlow``: one Flow execution is one agent session (seed "Running an agent").

The Flow ID is the session ID. The session never completes by itself; stop it with
``AsyncClient.stop_flow`` (``AgentSessionClient.stop_session``).

One piece past 600 lines because Dex binds every RPC to the Flow class: the session's RPCs are
its methods, each a thin call into the module that owns its logic (the Step modules,
``_compaction``, ``_elicitation``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from dex import (
    AttributeMapNotLoadedError,
    ChannelMessage,
    Context,
    Flow,
    PersistenceSchema,
    RPCResult,
    StepList,
    Stream,
    rpc,
)

from dex_agents._approval_steps import AwaitToolApproval
from dex_agents._builtin_records import (
    AgentPlan,
    PlanExecutionRequest,
    PlanExecutionResult,
    UserInputAnswer,
)
from dex_agents._builtin_steps import AwaitUserInput, DurableWait
from dex_agents._compaction import (
    CompactingRunner,
    message_range,
    read_messages,
    snapshot_messages,
    snapshot_summary,
)
from dex_agents._contract import AgentFrameworkRunner
from dex_agents._elicitation import (
    answer_question,
    expire_question,
    open_question,
    pending_questions,
    state_of,
)
from dex_agents._elicitation_records import (
    ElicitationAnswer,
    ElicitationAnswerResult,
    ElicitationRef,
    ElicitationRequest,
    ElicitationState,
)
from dex_agents._events import AgentEvent
from dex_agents._options import AgentSessionOptions
from dex_agents._persistence import (
    ACCEPTED_CLIENT_IDS,
    AGENT_MESSAGES,
    AGENT_PLAN,
    AGENT_STATE,
    AGENT_TOOL_CALLS,
    AGENT_USAGE,
    COMPACTION_DEFINITIONS,
    ELICITATIONS,
    INTERRUPT_RESOLUTIONS,
    PENDING_INTERRUPTS,
    PENDING_TIMER,
    PENDING_USER_INPUT,
    PLAN_EXECUTIONS,
    QUEUED_USER_MESSAGES,
    SHARED_DEFINITIONS,
    STEERED_FOR_TURN,
    STEERED_USER_MESSAGES,
    TEXT_PARTS,
    TURN_CANCEL,
    TURN_CANCELS,
    USER_INPUT_ANSWERS,
)
from dex_agents._records import (
    AgentInterruptResolution,
    AgentMessage,
    AgentSessionStartInput,
    AgentStatus,
    AgentUsage,
    AgentUserMessage,
    message_sequence_key,
)
from dex_agents._rpc_records import (
    AgentMessageQueue,
    AgentMessageRange,
    AgentMessagesPage,
    AgentMessagesSlice,
    AgentQueuedMessage,
    AgentSnapshot,
    CancelTurnRequest,
    ListAgentMessagesRequest,
    MessageTextPart,
    QueuedMessageRequest,
    ReadAgentMessagesRequest,
    ReadMessageTextRequest,
    ReplaceQueuedMessageRequest,
    ResolveInterruptRequest,
    TurnCancelResult,
)
from dex_agents._step_base import utc_now
from dex_agents._steps import (
    AwaitUserMessage,
    CompactContext,
    RecordTurnFailure,
    ResumeTurn,
    RunModel,
    StartAgentSession,
)
from dex_agents._subagent_steps import CallSubagent, FinishSubagentSession
from dex_agents._text_parts import read_part, text_part_key
from dex_agents._tool_steps import (
    CallSingleAttemptTool,
    CallTool,
    RecordToolFailure,
    RecordToolOutcomeUnknown,
)
from dex_agents._turn_cancel import RunningModelCalls
from dex_agents._turn_interruptions import steer_pending
from dex_agents._views import (
    PAGE_MESSAGES_BYTES,
    fit_messages,
    queued_bytes,
    record_view,
    record_view_limit,
    records_size,
    snapshot_messages_budget,
)
from dex_agents._wire_types import resolve_annotations

#: ``get_agent_snapshot`` returns at most this many of the newest messages.
SNAPSHOT_MESSAGE_LIMIT = 200
#: ``list_agent_messages`` clamps ``limit`` to ``1..MAX_PAGE_SIZE``.
MAX_PAGE_SIZE = 200
#: Wire name of each Flow type's AgentEvents Stream.
AGENT_EVENTS_STREAM_NAME = "AGENT_EVENTS"


class AgentSessionFlow(Flow[AgentSessionStartInput]):
    """The durable agent session Flow (seed "Flow shape").

    Register one per agent, each with its own ``flow_type``; the platform registers one shared
    Flow of type ``AgentSession``. The Registry needs ``allow_async_handlers=True`` and an
    ``AsyncWorker`` serves it with enough task slots for the largest batch of tool calls.

    Attributes:
        runner: The framework adapter.
        options: Session options.
        agent_events: This Flow type's AgentEvents Stream (``AgentEvent`` values).
        model_calls: The model calls running in this Worker process, which ``cancel_turn``
            abandons (platform addition, ``dex_agents._turn_cancel``).
    """

    def __init__(
        self,
        runner: AgentFrameworkRunner,
        *,
        flow_type: str = "AgentSession",
        options: AgentSessionOptions | None = None,
    ) -> None:
        self.runner = runner
        self.options = options or AgentSessionOptions()
        if self.options.compaction is not None and not isinstance(runner, CompactingRunner):
            raise TypeError("AgentSessionOptions.compaction needs a CompactingRunner")
        self._flow_type = flow_type
        self.agent_events: Stream[AgentEvent] = Stream(
            AGENT_EVENTS_STREAM_NAME, AgentEvent, self.options.agent_events_capacity_bytes
        )
        self.model_calls = RunningModelCalls()

    def get_flow_type(self) -> str:
        return self._flow_type

    def get_steps(self) -> StepList[AgentSessionStartInput]:
        return StepList.start_step(StartAgentSession(self)).other_steps(
            AwaitUserMessage(self),
            RunModel(self),
            AwaitToolApproval(self),
            CallTool(self),
            CallSingleAttemptTool(self),
            RecordToolFailure(self),
            RecordToolOutcomeUnknown(self),
            ResumeTurn(self),
            RecordTurnFailure(self),
            DurableWait(self),
            AwaitUserInput(self),
            CompactContext(self),
            CallSubagent(self),
            FinishSubagentSession(self),
        )

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(
            *SHARED_DEFINITIONS, *COMPACTION_DEFINITIONS, self.agent_events
        )

    @rpc(is_transactional=True, load_channels=(QUEUED_USER_MESSAGES, STEERED_USER_MESSAGES))
    def send_user_message(self, context: Context, message: AgentUserMessage) -> RPCResult[bool]:
        """Queue a user message for the next turn; ``False`` for blank text.

        Platform additions: ``created_at`` is set to the Worker clock when the sender left it
        empty; ``False`` too while ``AgentSessionOptions.max_queued_messages`` messages wait.
        A message with a ``client_id`` that this session already accepted is not queued again
        and answers ``True``: the ID is recorded in ``ACCEPTED_CLIENT_IDS`` in the same commit,
        so a sender may repeat a send whose answer it lost. ``AgentSessionClient`` locks and
        loads that one instance per call; without them the ID is not checked.
        """
        if not message.text.strip():
            return RPCResult(False)
        client_id = message.client_id
        if client_id and _accepted_before(context, client_id):
            return RPCResult(True)
        limit = self.options.max_queued_messages
        waiting = QUEUED_USER_MESSAGES.size(context) + STEERED_USER_MESSAGES.size(context)
        if limit is not None and waiting >= limit:
            return RPCResult(False)
        if not self._queue_has_room(context, message.text):
            return RPCResult(False)
        stamped = _stamped(message)
        QUEUED_USER_MESSAGES.publish(context, stamped)
        if client_id and _client_id_checkable(client_id):
            accepted_at = stamped.created_at.isoformat() if stamped.created_at else ""
            ACCEPTED_CLIENT_IDS.set(context, client_id, accepted_at)
        return RPCResult(True)

    @rpc
    def cancel_turn(
        self, context: Context, request: CancelTurnRequest
    ) -> RPCResult[TurnCancelResult]:
        """Platform addition: cancel the running turn; the session goes on.

        ``no_turn`` when no turn runs. Otherwise records the cancel in ``TURN_CANCEL`` and wakes
        the turn's ResumeTurn (``TURN_CANCELS``) in one commit, and abandons the turn's model
        call when it runs in this Worker process (``dex_agents._turn_cancel``): its streamed
        text is kept as an assistant message marked ``interrupted``. Tool calls not started
        end ``cancelled``, running ones finish and keep their records, pending approvals are
        withdrawn, and the turn ends with ``turn_cancelled`` instead of calling the model
        again. Queued messages stay queued; the next starts a normal turn. The engine keeps
        the cancel, so Steps that run after a Worker restart apply it. Accepting the same
        turn's cancel again changes nothing and answers ``accepted`` again. ``turn_ended``
        when ``request.turn_id`` names another turn than the running one, whose ID is then
        the result's ``turn_id``.
        """
        state = AGENT_STATE.get(context)
        if (
            state is None
            or state.turn_id is None
            or state.status is AgentStatus.WAITING_FOR_USER_MESSAGE
        ):
            return RPCResult(TurnCancelResult(False, reason="no_turn"))
        if request.turn_id and request.turn_id != state.turn_id:
            return RPCResult(
                TurnCancelResult(False, turn_id=state.turn_id, reason="turn_ended")
            )
        if TURN_CANCEL.get(context) != state.turn_id:
            TURN_CANCEL.set(context, state.turn_id)
            TURN_CANCELS.publish(context, state.turn_id, "cancel")
        self.model_calls.signal(context.flow_id, state.turn_id)
        return RPCResult(TurnCancelResult(True, turn_id=state.turn_id))

    @rpc(lock_attributes=(PENDING_USER_INPUT.lock(),))
    def answer_user_input(self, context: Context, answer: UserInputAnswer) -> RPCResult[bool]:
        """Platform addition: answer the open ``request_user_input`` question.

        Locks PendingUserInput; ``False`` when no question with that call ID is open or the
        answer is blank. Otherwise removes the question and publishes the answer in one commit.
        """
        pending = PENDING_USER_INPUT.get(context)
        if pending is None or pending.tool_call_id != answer.tool_call_id:
            return RPCResult(False)
        if not answer.answer.strip():
            return RPCResult(False)
        PENDING_USER_INPUT.delete(context)
        USER_INPUT_ANSWERS.publish(context, f"{pending.turn_id}.{pending.tool_call_id}", answer)
        return RPCResult(True)

    # --- MCP elicitation (platform addition; dex_agents._elicitation) ---------------------------

    @rpc(lock_attributes=(ELICITATIONS.lock(),), load_attribute_maps=(AGENT_TOOL_CALLS,))
    def open_elicitation(
        self, context: Context, request: ElicitationRequest
    ) -> RPCResult[ElicitationState]:
        """Platform addition: record a question an MCP server asks during the running tool
        call ``request.tool_call_id`` (``dex_agents._elicitation.open_question``).

        Locks ELICITATIONS. The same question asked by an earlier attempt of the call comes
        back as it stands (answered or not); a new one is pending until its deadline
        (``timeout_seconds`` from now, Worker clock), or withdrawn at once while a steered
        message waits. A call that is not running gets a withdrawn question that is not kept.
        """
        state = AGENT_STATE.get(context)
        record = AGENT_TOOL_CALLS.get(context, request.tool_call_id)
        return RPCResult(
            open_question(
                context,
                request,
                record,
                turn_id=state.turn_id if state is not None else None,
                steer_pending=steer_pending(self, context),
            )
        )

    @rpc(lock_attributes=(ELICITATIONS.lock(),))
    def answer_elicitation(
        self, context: Context, answer: ElicitationAnswer
    ) -> RPCResult[ElicitationAnswerResult]:
        """Platform addition: the user's answer to a pending question of an MCP server.

        Locks ELICITATIONS; checks the action, the deadline and (``accept`` on a form) the
        content against the server's schema, then stores the answer and bumps
        ``ELICITATION_VERSION`` in one commit, which wakes the waiting tool Step. Refused
        (nothing changes, except that a question past its deadline is expired):
        ``not_pending``, ``expired``, ``invalid`` with messages per field, ``bad_action``.
        """
        state = AGENT_STATE.get(context)
        return RPCResult(
            answer_question(context, answer, turn_id=state.turn_id if state is not None else None)
        )

    @rpc
    def get_elicitation(
        self, context: Context, request: ElicitationRef
    ) -> RPCResult[ElicitationState]:
        """Platform addition: one question by ID and ``ELICITATION_VERSION`` (read-only)."""
        return RPCResult(state_of(context, request.elicitation_id))

    @rpc(lock_attributes=(ELICITATIONS.lock(),))
    def close_elicitation(
        self, context: Context, request: ElicitationRef
    ) -> RPCResult[ElicitationState]:
        """Platform addition: expire a question still pending past its deadline (Worker
        clock); the waiting tool Step calls it at the deadline. Locks ELICITATIONS."""
        return RPCResult(expire_question(context, request.elicitation_id))

    @rpc(is_transactional=True)
    def execute_plan(
        self, context: Context, request: PlanExecutionRequest
    ) -> RPCResult[PlanExecutionResult]:
        """Platform addition: start executing (or continuing) the plan at ``request.revision``.

        Accepted only when the session waits for a user message, nothing is queued or steered,
        no execution is already requested, and that revision is the current draft or an active
        plan with unfinished tasks; otherwise ``accepted=False`` with the reason
        (``PlanExecutionResult``). A second request accepted in the moment between
        AwaitUserMessage taking the first and committing its turn is harmless: AwaitUserMessage
        drops a request whose revision is no longer current or executable.
        """
        if not self.options.plans:
            return RPCResult(PlanExecutionResult(False, "no_plans"))
        state = AGENT_STATE.get(context)
        if state is None:
            return RPCResult(PlanExecutionResult(False, "no_session"))
        plan = AGENT_PLAN.get(context)
        if plan is None or plan.revision != request.revision:
            return RPCResult(PlanExecutionResult(False, "stale_revision"))
        if not plan.is_executable:
            return RPCResult(PlanExecutionResult(False, "not_executable"))
        if PLAN_EXECUTIONS.size(context):
            return RPCResult(PlanExecutionResult(False, "already_requested"))
        if state.status is not AgentStatus.WAITING_FOR_USER_MESSAGE:
            return RPCResult(PlanExecutionResult(False, "busy"))
        if QUEUED_USER_MESSAGES.size(context) or STEERED_USER_MESSAGES.size(context):
            return RPCResult(PlanExecutionResult(False, "queued"))
        PLAN_EXECUTIONS.publish(context, request)
        return RPCResult(PlanExecutionResult(True))

    @rpc(load_channels=(QUEUED_USER_MESSAGES, STEERED_USER_MESSAGES))
    def get_message_queue(self, context: Context) -> RPCResult[AgentMessageQueue]:
        """Platform addition: both queues, oldest first, from one invocation (read-only)."""
        return RPCResult(
            AgentMessageQueue(
                queued=_queued(QUEUED_USER_MESSAGES.pending_messages(context)),
                steered=_steered(context),
            )
        )

    @rpc(is_transactional=True, load_channels=(QUEUED_USER_MESSAGES,))
    def delete_queued_message(
        self, context: Context, request: QueuedMessageRequest
    ) -> RPCResult[bool]:
        """Platform addition: delete a message still pending in QueuedUserMessages.

        ``False`` when it is not pending. Transactional: if a Step consumes it before this
        commits, Dex rejects the RPC (``ChannelMessageNotFoundError``) and nothing changes.
        """
        pending = _find_queued(context, request.message_id)
        if pending is None:
            return RPCResult(False)
        QUEUED_USER_MESSAGES.delete(context, pending.message_id)
        return RPCResult(True)

    def _queue_has_room(self, context: Context, text: str, replacing: str = "") -> bool:
        """Whether ``text`` fits ``max_queued_bytes`` with the queued and steered messages
        (less the queued one with Channel message ID ``replacing``)."""
        budget = self.options.max_queued_bytes
        if budget is None:
            return True
        waiting = [
            item.value.text
            for item in QUEUED_USER_MESSAGES.pending_messages(context)
            if item.message_id != replacing
        ] + [item.value.text for item in STEERED_USER_MESSAGES.pending_messages(context)]
        return queued_bytes([*waiting, text]) <= budget

    @rpc(is_transactional=True, load_channels=(QUEUED_USER_MESSAGES, STEERED_USER_MESSAGES))
    def replace_queued_message(
        self, context: Context, request: ReplaceQueuedMessageRequest
    ) -> RPCResult[bool]:
        """Platform addition (Edit): remove a pending message and append ``request.message`` at
        the tail, in one commit.

        ``False`` when the old message is not pending or the new text is blank; a message
        consumed before the commit fails the RPC (``ChannelMessageNotFoundError``) and nothing
        changes.
        """
        pending = _find_queued(context, request.message_id)
        if pending is None or not request.message.text.strip():
            return RPCResult(False)
        if not self._queue_has_room(context, request.message.text, pending.message_id):
            return RPCResult(False)
        QUEUED_USER_MESSAGES.delete(context, pending.message_id)
        QUEUED_USER_MESSAGES.publish(context, _stamped(request.message))
        return RPCResult(True)

    @rpc(is_transactional=True, load_channels=(QUEUED_USER_MESSAGES,))
    def steer_queued_message(
        self, context: Context, request: QueuedMessageRequest
    ) -> RPCResult[bool]:
        """Platform addition (Steer): move a pending message to SteeredUserMessages.

        Loads QueuedUserMessages, finds the value, deletes it and publishes it to
        SteeredUserMessages in one commit; ``False`` when it is not pending or the session does
        not steer (``AgentSessionOptions.steering``). A message consumed before the commit
        fails the RPC (``ChannelMessageNotFoundError``) and neither effect commits.
        """
        if not self.options.steering:
            return RPCResult(False)
        pending = _find_queued(context, request.message_id)
        if pending is None:
            return RPCResult(False)
        QUEUED_USER_MESSAGES.delete(context, pending.message_id)
        STEERED_USER_MESSAGES.publish(context, pending.value)
        return RPCResult(True)

    @rpc(lock_attributes=(PENDING_INTERRUPTS.lock(),))
    def resolve_interrupt(
        self, context: Context, request: ResolveInterruptRequest
    ) -> RPCResult[bool]:
        """Answer a pending approval.

        Locks PendingInterrupts; ``False`` when the interrupt is not pending or past its
        deadline. Otherwise removes it and publishes the answer in one commit; an approval
        drops ``rejection_message``, a rejection drops ``edited_arguments``.
        """
        interrupts = PENDING_INTERRUPTS.get(context) or []
        pending = next(
            (item for item in interrupts if item.interrupt_id == request.interrupt_id), None
        )
        if pending is None or (pending.deadline is not None and utc_now() >= pending.deadline):
            return RPCResult(False)
        PENDING_INTERRUPTS.set(
            context, [item for item in interrupts if item.interrupt_id != request.interrupt_id]
        )
        INTERRUPT_RESOLUTIONS.publish(
            context,
            request.interrupt_id,
            AgentInterruptResolution(
                interrupt_id=request.interrupt_id,
                approved=request.approved,
                rejection_message=None if request.approved else request.rejection_message,
                edited_arguments=request.edited_arguments if request.approved else None,
            ),
        )
        return RPCResult(True)

    @rpc(
        load_attribute_maps=(AGENT_MESSAGES, AGENT_TOOL_CALLS),
        load_channels=(QUEUED_USER_MESSAGES, STEERED_USER_MESSAGES),
    )
    def get_agent_snapshot(self, context: Context) -> RPCResult[AgentSnapshot]:
        """State, last 200 messages, pending interrupts, the active turn's tool calls, usage and
        queued message count, plus (platform addition) the queued messages themselves; also
        served for retained closed sessions. Platform addition (``_views``): the messages are
        the newest of those that fit what the queue and the records leave of
        ``SNAPSHOT_BYTES`` (``snapshot_messages_budget``: 256 KiB to 1 MiB), and long record
        outputs and arguments are cut to a share of ``RECORDS_VIEW_BYTES``."""
        state = AGENT_STATE.get(context)
        tool_calls = sorted(
            (
                AGENT_TOOL_CALLS.get(context, key)
                for key in AGENT_TOOL_CALLS.get_all_instance_keys(context)
            ),
            key=lambda record: record.deferral_order,
        )
        limit = record_view_limit(len(tool_calls))
        views = [record_view(record, limit) for record in tool_calls]
        queued = _queued(QUEUED_USER_MESSAGES.pending_messages(context))
        steered = _steered(context)
        budget = snapshot_messages_budget(
            queued_bytes([item.text for item in (*queued, *steered)]), records_size(views)
        )
        return RPCResult(
            AgentSnapshot(
                state=state,
                messages=fit_messages(snapshot_messages(context, SNAPSHOT_MESSAGE_LIMIT), budget),
                pending_interrupts=list(PENDING_INTERRUPTS.get(context) or []),
                tool_calls=views,
                usage=AGENT_USAGE.get(context) or AgentUsage(),
                queued_message_count=QUEUED_USER_MESSAGES.size(context),
                last_turn_error=state.last_turn_error if state is not None else None,
                queued_messages=queued,
                steered_messages=steered,
                pending_timer=PENDING_TIMER.get(context),
                pending_input=PENDING_USER_INPUT.get(context),
                plan=_visible_plan(AGENT_PLAN.get(context)),
                plan_execution_requested=PLAN_EXECUTIONS.size(context) > 0,
                summary=snapshot_summary(context),
                pending_elicitations=pending_questions(
                    context,
                    state.turn_id if state is not None else None,
                    {record.tool_call_id: record for record in tool_calls},
                ),
            )
        )

    @rpc(load_attribute_maps=(AGENT_MESSAGES,))
    def list_agent_messages(
        self, context: Context, request: ListAgentMessagesRequest
    ) -> RPCResult[AgentMessagesPage]:
        """Messages after ``after_sequence``, oldest first; ``limit`` clamped to 1..200.
        Platform addition (``_views``): only the oldest that fit ``PAGE_MESSAGES_BYTES``."""
        limit = min(max(request.limit, 1), MAX_PAGE_SIZE)
        keys = [
            key
            for key in AGENT_MESSAGES.get_all_instance_keys(context)
            if int(key) > request.after_sequence
        ]
        messages: list[AgentMessage] = fit_messages(
            [AGENT_MESSAGES.get(context, key) for key in keys[:limit]],
            PAGE_MESSAGES_BYTES,
            keep_newest=False,
        )
        return RPCResult(AgentMessagesPage(messages=messages, has_more=len(keys) > len(messages)))

    # --- context compaction and retention (platform addition) ---------------------------------

    @rpc
    def get_message_range(self, context: Context) -> RPCResult[AgentMessageRange]:
        """Platform addition: the retained and summarized message sequences (loads no
        message)."""
        return RPCResult(message_range(context))

    @rpc
    def read_agent_messages(
        self, context: Context, request: ReadAgentMessagesRequest
    ) -> RPCResult[AgentMessagesSlice]:
        """Platform addition: retained messages ``first..last`` (at most 200), oldest first.

        Loads only the instances the caller adds per call
        (``dex.RPCInvokeOptions.load_attribute_map_instances``); ``complete`` is False when a
        retained message in the range was not among them.
        """
        return RPCResult(read_messages(context, request))

    @rpc
    def read_message_text(
        self, context: Context, request: ReadMessageTextRequest
    ) -> RPCResult[MessageTextPart]:
        """Platform addition: part ``request.part`` of a stored message's whole text
        (``dex_agents._text_parts``; at most ``TEXT_PART_BYTES`` of UTF-8).

        Loads only the instances the caller adds per call: the message
        (``AGENT_MESSAGES``) and, once the caller knows the message's ``TextParts.key``, the
        one ``TEXT_PARTS`` instance (``AgentSessionClient.read_message_text`` does). A message
        that was not loaded or is not stored answers ``found`` False.
        """
        return RPCResult(message_text_part(context, request))

    @rpc(
        load_attribute_maps=(AGENT_TOOL_CALLS,),
        load_channels=(QUEUED_USER_MESSAGES, STEERED_USER_MESSAGES),
    )
    def get_agent_snapshot_page(self, context: Context) -> RPCResult[AgentSnapshot]:
        """Platform addition: ``get_agent_snapshot`` loading only the last page's messages,
        which the caller adds per call (``AgentSessionClient.get_agent_snapshot`` does when
        the Flow compacts); messages it did not load are left out."""
        return self.get_agent_snapshot(context)


def message_text_part(context: Context, request: ReadMessageTextRequest) -> MessageTextPart:
    """``read_message_text``'s answer from the instances the call loaded."""
    try:
        message = AGENT_MESSAGES.get(context, message_sequence_key(request.sequence))
    except (AttributeMapNotLoadedError, ValueError):
        message = None
    if message is None:
        return MessageTextPart(found=False, sequence=request.sequence, part=request.part)
    parts = message.text_parts
    if parts is None:
        text, count = read_part(message.text, request.part)
        return MessageTextPart(
            found=True, sequence=request.sequence, part=request.part, parts=count,
            text_length=len(message.text), text=text,
        )
    answer = MessageTextPart(
        found=True, sequence=request.sequence, part=request.part, parts=parts.count,
        text_length=parts.length, parts_key=parts.key,
    )
    if request.parts_key != parts.key or not 0 <= request.part < parts.count:
        return answer
    try:
        text = TEXT_PARTS.get(context, text_part_key(parts.key, request.part))
    except AttributeMapNotLoadedError:
        return answer
    return replace(answer, text=text)


def _client_id_checkable(client_id: str) -> bool:
    """Whether ``client_id`` can key ``ACCEPTED_CLIENT_IDS`` (map keys have no ``/``)."""
    return "/" not in client_id


def _accepted_before(context: Context, client_id: str) -> bool:
    """Whether ``send_user_message`` already accepted a message sent as ``client_id``.

    The instance must be loaded for the call (``AgentSessionClient.send_user_message`` does);
    an instance that was not loaded counts as not accepted.
    """
    if not _client_id_checkable(client_id):
        return False
    try:
        accepted: str | None = ACCEPTED_CLIENT_IDS.get(context, client_id)
    except (KeyError, AttributeMapNotLoadedError):
        return False
    return accepted is not None


def _stamped(message: AgentUserMessage) -> AgentUserMessage:
    return message if message.created_at is not None else replace(message, created_at=utc_now())


def _queued_entry(message_id: str, value: AgentUserMessage) -> AgentQueuedMessage:
    return AgentQueuedMessage(
        message_id=message_id,
        text=value.text,
        plan_mode=value.plan_mode,
        created_at=value.created_at,
        client_id=value.client_id,
    )


def _queued(pending: Sequence[ChannelMessage[AgentUserMessage]]) -> list[AgentQueuedMessage]:
    return [_queued_entry(item.message_id, item.value) for item in pending]


def _steered(context: Context) -> list[AgentQueuedMessage]:
    """Steered messages a Step took but no model call saw yet, then those still pending."""
    taken = [_queued_entry(item.client_id, item) for item in STEERED_FOR_TURN.get(context) or []]
    return taken + _queued(STEERED_USER_MESSAGES.pending_messages(context))


def _find_queued(context: Context, message_id: str) -> ChannelMessage[AgentUserMessage] | None:
    """The pending queued message whose Channel message ID or ``client_id`` is ``message_id``."""
    if not message_id:
        return None
    return next(
        (
            item
            for item in QUEUED_USER_MESSAGES.pending_messages(context)
            if message_id in (item.message_id, item.value.client_id)
        ),
        None,
    )


def _visible_plan(plan: AgentPlan | None) -> AgentPlan | None:
    """The plan a snapshot shows: ``None`` once the model cleared it."""
    return plan if plan is not None and plan.tasks else None


resolve_annotations(globals())
