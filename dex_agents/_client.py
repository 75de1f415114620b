"""``AgentSessionClient``: typed calls on one ``AgentSessionFlow`` (seed "RPCs")."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from dex import (
    AsyncClient,
    AttributeMatch,
    RequestTimeoutError,
    RPCInvokeOptions,
    RpcLockConflictError,
    WaitForAttributeOptions,
)

from dex_agents._builtin_records import PlanExecutionRequest, PlanExecutionResult, UserInputAnswer
from dex_agents._compaction import MAX_READ_MESSAGES, message_loads
from dex_agents._elicitation_records import (
    ElicitationAnswer,
    ElicitationAnswerResult,
    ElicitationRef,
    ElicitationRequest,
    ElicitationState,
)
from dex_agents._flow import AgentSessionFlow
from dex_agents._persistence import (
    ACCEPTED_CLIENT_IDS,
    AGENT_MESSAGES,
    ELICITATION_VERSION,
    TEXT_PARTS,
)
from dex_agents._records import (
    AgentSessionStartInput,
    AgentUserMessage,
    ToolPolicy,
    message_sequence_key,
)
from dex_agents._rpc_records import (
    AgentMessageQueue,
    AgentMessageRange,
    AgentMessagesBeforePage,
    AgentMessagesPage,
    AgentMessagesSlice,
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
from dex_agents._text_parts import text_part_key

#: How long ``resolve_interrupt`` retries ``RpcLockConflictError`` (seed "RPCs").
LOCK_CONFLICT_RETRY_SECONDS = 5.0
_LOCK_CONFLICT_PAUSE_SECONDS = 0.05
#: How often a compacting Flow's client re-reads a page whose range moved while it read.
_STALE_READ_ATTEMPTS = 5


class AgentSessionClient:
    """Starts, drives and reads agent sessions through a Dex ``AsyncClient``.

    ``client`` must have been built with a Registry that holds ``flow``. Every method raises the
    SDK's ``DexServiceError`` family when the engine rejects the call (for example
    ``FlowNotActiveOrNotFoundError`` for a stopped session on a writing RPC).
    """

    def __init__(self, client: AsyncClient, flow: AgentSessionFlow) -> None:
        self.client = client
        self.flow = flow

    async def start_session(
        self,
        session_id: str,
        initial_message: str = "",
        *,
        agent_config: dict[str, Any] | None = None,
        tool_policies: Mapping[str, ToolPolicy] | None = None,
        plan_mode: bool = False,
    ) -> str:
        """Start a session; a non-blank ``initial_message`` starts its first turn.

        ``agent_config``, ``tool_policies`` and ``plan_mode`` (the first message asks for a
        plan, as ``send_user_message``'s) are platform additions (see
        ``AgentSessionStartInput``). Returns the Dex run ID.

        Raises:
            FlowAlreadyStartedError: If the session ID is taken.
        """
        return await self.client.start_flow(
            self.flow,
            session_id,
            AgentSessionStartInput(
                initial_message=initial_message,
                agent_config=agent_config,
                tool_policies=dict(tool_policies or {}),
                initial_plan_mode=plan_mode,
            ),
        )

    async def send_user_message(
        self,
        session_id: str,
        text: str,
        *,
        plan_mode: bool = False,
        client_id: str = "",
        created_at: datetime | None = None,
    ) -> bool:
        """Queue a user message; ``False`` for blank text.

        ``plan_mode``, ``client_id`` and ``created_at`` are platform additions
        (``AgentUserMessage``). A non-empty ``client_id`` (no ``/``) makes the send
        idempotent: a message the session already accepted under that ID answers ``True`` and
        is not queued again, so a send whose answer was lost may be repeated. Concurrent sends
        of the same ID take turns on its ``ACCEPTED_CLIENT_IDS`` lock (retried for 5 seconds).
        ``created_at`` (timezone-aware) is when the user sent it, for a sender that kept the
        message a while before this send (an outbox); ``None`` stamps it with the Worker
        clock when the session accepts it.

        Raises:
            RpcLockConflictError: If another send of the same ``client_id`` held the lock for
                5 seconds.
        """
        message = AgentUserMessage(
            text=text, plan_mode=plan_mode, client_id=client_id, created_at=created_at
        )
        if not client_id or "/" in client_id:
            result: bool = await self.client.invoke_rpc(
                self.flow.send_user_message, session_id, message
            )
            return result
        options = RPCInvokeOptions(
            lock_attribute_map_instances=(ACCEPTED_CLIENT_IDS.lock(client_id),),
            load_attribute_map_instances=(ACCEPTED_CLIENT_IDS.load(client_id),),
        )
        return await self._invoke_retrying_lock_conflicts(
            self.flow.send_user_message, session_id, message, options=options
        )

    async def answer_user_input(self, session_id: str, tool_call_id: str, answer: str) -> bool:
        """Platform addition: answer the open question of ``request_user_input`` call
        ``tool_call_id``; ``False`` when it is not open or ``answer`` is blank.

        Retries ``RpcLockConflictError`` (AwaitUserInput deciding) for 5 seconds.
        """
        return await self._invoke_retrying_lock_conflicts(
            self.flow.answer_user_input, session_id, UserInputAnswer(tool_call_id, answer)
        )

    async def open_elicitation(
        self, session_id: str, request: ElicitationRequest
    ) -> ElicitationState:
        """Platform addition (MCP elicitation): record a question an MCP server asks during
        the running tool call ``request.tool_call_id``, or find the same question an earlier
        attempt of the call asked (``AgentSessionFlow.open_elicitation``).

        Retries ``RpcLockConflictError`` (another question or answer being stored) for 5
        seconds.

        Raises:
            RpcLockConflictError: If ``ELICITATIONS`` stayed locked that long.
            FlowNotActiveOrNotFoundError: The session is stopped or unknown.
        """
        return await self._invoke_locked(self.flow.open_elicitation, session_id, request)

    async def answer_elicitation(
        self,
        session_id: str,
        elicitation_id: str,
        action: str,
        content: dict[str, Any] | None = None,
    ) -> ElicitationAnswerResult:
        """Platform addition: answer a pending question of an MCP server with ``action``
        (``accept``, ``decline`` or ``cancel``) and, for ``accept`` on a form, ``content``;
        see ``ElicitationAnswerResult`` for refusals (a second answer is ``not_pending``).

        Retries ``RpcLockConflictError`` for 5 seconds.

        Raises:
            RpcLockConflictError: If ``ELICITATIONS`` stayed locked that long.
            FlowNotActiveOrNotFoundError: The session is stopped or unknown.
        """
        return await self._invoke_locked(
            self.flow.answer_elicitation,
            session_id,
            ElicitationAnswer(elicitation_id, action, content),
        )

    async def get_elicitation(self, session_id: str, elicitation_id: str) -> ElicitationState:
        """Platform addition: one question of the session (``None`` when it has none by that
        ID) and the current ``ELICITATION_VERSION``, read in one RPC."""
        state: ElicitationState = await self.client.invoke_rpc(
            self.flow.get_elicitation, session_id, ElicitationRef(elicitation_id)
        )
        return state

    async def close_elicitation(self, session_id: str, elicitation_id: str) -> ElicitationState:
        """Platform addition: expire a question that is pending past its deadline (the Worker
        clock decides) and return it as it then stands.

        Raises:
            RpcLockConflictError: If ``ELICITATIONS`` stayed locked for 5 seconds.
        """
        return await self._invoke_locked(
            self.flow.close_elicitation, session_id, ElicitationRef(elicitation_id)
        )

    async def wait_for_elicitation_change(
        self,
        session_id: str,
        seen_version: int,
        *,
        timeout: timedelta,  # noqa: ASYNC109 - the engine's long-poll budget
    ) -> bool:
        """Platform addition: wait until ``ELICITATION_VERSION`` passes ``seen_version``
        (a long poll the engine answers without a Worker); ``False`` after ``timeout`` (whole
        seconds, at least one) without a change.

        Raises:
            FlowNotActiveOrNotFoundError: The session stopped (or is unknown).
        """
        try:
            await self.client.wait_for_attribute_match(
                session_id,
                ELICITATION_VERSION,
                AttributeMatch.greater_than(seen_version),
                WaitForAttributeOptions(request_timeout=timeout),
            )
        except RequestTimeoutError:
            return False
        return True

    async def execute_plan(self, session_id: str, revision: int) -> PlanExecutionResult:
        """Platform addition: execute (or continue) the plan at ``revision``; see
        ``AgentSessionFlow.execute_plan`` for when it is refused."""
        result: PlanExecutionResult = await self.client.invoke_rpc(
            self.flow.execute_plan, session_id, PlanExecutionRequest(revision)
        )
        return result

    async def get_message_queue(self, session_id: str) -> AgentMessageQueue:
        """Platform addition: the queued and steered messages, read in one RPC."""
        queue: AgentMessageQueue = await self.client.invoke_rpc(
            self.flow.get_message_queue, session_id
        )
        return queue

    async def delete_queued_message(self, session_id: str, message_id: str) -> bool:
        """Platform addition: delete a pending queued message by Channel message ID or
        ``client_id``; ``False`` when it is not pending.

        Raises:
            ChannelMessageNotFoundError: A Step consumed it while the RPC ran (nothing changed).
        """
        result: bool = await self.client.invoke_rpc(
            self.flow.delete_queued_message, session_id, QueuedMessageRequest(message_id)
        )
        return result

    async def replace_queued_message(
        self,
        session_id: str,
        message_id: str,
        text: str,
        *,
        plan_mode: bool = False,
        client_id: str = "",
    ) -> bool:
        """Platform addition (Edit): remove a pending message and queue ``text`` at the tail, in
        one commit; ``False`` when it is not pending or ``text`` is blank.

        Raises:
            ChannelMessageNotFoundError: A Step consumed it while the RPC ran (nothing changed).
        """
        request = ReplaceQueuedMessageRequest(
            message_id,
            AgentUserMessage(text=text, plan_mode=plan_mode, client_id=client_id),
        )
        result: bool = await self.client.invoke_rpc(
            self.flow.replace_queued_message, session_id, request
        )
        return result

    async def steer_queued_message(self, session_id: str, message_id: str) -> bool:
        """Platform addition (Steer): move a pending queued message to the steered queue;
        ``False`` when it is not pending or the session does not steer.

        Raises:
            ChannelMessageNotFoundError: A Step consumed it while the RPC ran (nothing changed).
        """
        result: bool = await self.client.invoke_rpc(
            self.flow.steer_queued_message, session_id, QueuedMessageRequest(message_id)
        )
        return result

    async def cancel_turn(self, session_id: str, turn_id: str = "") -> TurnCancelResult:
        """Platform addition: cancel the running turn (``AgentSessionFlow.cancel_turn``), only
        if it is ``turn_id`` when one is given; ``accepted`` False with reason ``no_turn`` when
        none runs, ``turn_ended`` when another one does. Safe to repeat.
        """
        result: TurnCancelResult = await self.client.invoke_rpc(
            self.flow.cancel_turn, session_id, CancelTurnRequest(turn_id)
        )
        return result

    async def resolve_interrupt(
        self,
        session_id: str,
        interrupt_id: str,
        *,
        approved: bool,
        rejection_message: str | None = None,
        edited_arguments: str | None = None,
    ) -> bool:
        """Approve or reject a pending tool call; ``False`` when not pending or past its deadline.

        ``edited_arguments`` (platform addition): JSON text the approved call runs with instead
        of the model's arguments; the record keeps the model's in ``original_arguments``.

        Retries ``RpcLockConflictError`` (a Step holding PendingInterrupts) for 5 seconds.

        Raises:
            RpcLockConflictError: If the lock stays taken for 5 seconds.
        """
        request = ResolveInterruptRequest(
            interrupt_id=interrupt_id,
            approved=approved,
            rejection_message=rejection_message,
            edited_arguments=edited_arguments,
        )
        return await self._invoke_retrying_lock_conflicts(
            self.flow.resolve_interrupt, session_id, request
        )

    async def _invoke_locked(
        self,
        rpc: Any,
        session_id: str,
        request: Any,
        *,
        options: RPCInvokeOptions | None = None,
    ) -> Any:
        """Invoke an RPC that locks an Attribute a Step (or another call) may hold, retrying
        ``RpcLockConflictError`` for ``LOCK_CONFLICT_RETRY_SECONDS``; ``options`` adds
        per-call map-instance locks and loads. Returns the RPC's output.

        Raises:
            RpcLockConflictError: If the lock stays taken that long.
        """
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + LOCK_CONFLICT_RETRY_SECONDS
        while True:
            try:
                return await self.client.invoke_rpc(
                    rpc, session_id, request, options=options or RPCInvokeOptions()
                )
            except RpcLockConflictError:
                if loop.time() >= give_up_at:
                    raise
                await asyncio.sleep(_LOCK_CONFLICT_PAUSE_SECONDS)

    async def _invoke_retrying_lock_conflicts(
        self,
        rpc: Any,
        session_id: str,
        request: Any,
        *,
        options: RPCInvokeOptions | None = None,
    ) -> bool:
        """``_invoke_locked`` for the boolean RPCs."""
        return bool(await self._invoke_locked(rpc, session_id, request, options=options))

    async def get_agent_snapshot(self, session_id: str) -> AgentSnapshot:
        """The session's snapshot; works for retained closed sessions too.

        When the Flow compacts (platform addition) it loads only the last page of messages:
        ``get_message_range``, then ``get_agent_snapshot_page`` with those instances (again if
        a turn stored messages in between).
        """
        if self.flow.options.compaction is not None:
            for _ in range(_STALE_READ_ATTEMPTS):
                known = await self.get_message_range(session_id)
                first = max(known.first_retained_sequence, known.last_sequence - 199)
                paged: AgentSnapshot = await self.client.invoke_rpc(
                    self.flow.get_agent_snapshot_page,
                    session_id,
                    options=_loading(first, known.last_sequence),
                )
                stored = paged.state.message_count if paged.state is not None else 0
                if stored == known.last_sequence:
                    return paged
        snapshot: AgentSnapshot = await self.client.invoke_rpc(
            self.flow.get_agent_snapshot, session_id
        )
        return snapshot

    async def list_agent_messages(
        self, session_id: str, *, after_sequence: int = 0, limit: int = 200
    ) -> AgentMessagesPage:
        """Messages with ``sequence > after_sequence``, oldest first; ``limit`` clamped 1..200.

        When the Flow compacts (platform addition) only retained messages exist, and only the
        page's instances are loaded.
        """
        if self.flow.options.compaction is not None:
            limit = min(max(limit, 1), MAX_READ_MESSAGES)
            for _ in range(_STALE_READ_ATTEMPTS):
                known = await self.get_message_range(session_id)
                first = max(after_sequence + 1, known.first_retained_sequence)
                last = min(known.last_sequence, first + limit - 1)
                read = await self._read_messages(session_id, first, last)
                if read.complete:
                    # A page over the byte budget ends early (``_views``): more follow it.
                    shown = read.messages[-1].sequence if read.messages else last
                    return AgentMessagesPage(
                        messages=read.messages,
                        has_more=shown < read.message_range.last_sequence,
                    )
        page: AgentMessagesPage = await self.client.invoke_rpc(
            self.flow.list_agent_messages,
            session_id,
            ListAgentMessagesRequest(after_sequence=after_sequence, limit=limit),
        )
        return page

    async def get_message_range(self, session_id: str) -> AgentMessageRange:
        """Platform addition: the oldest retained, newest and last summarized sequences."""
        known: AgentMessageRange = await self.client.invoke_rpc(
            self.flow.get_message_range, session_id
        )
        return known

    async def list_agent_messages_before(
        self, session_id: str, *, before: int | None = None, limit: int = 50
    ) -> AgentMessagesBeforePage:
        """Platform addition: the newest ``limit`` (clamped 1..200) retained messages with
        ``sequence < before`` (the newest when ``before`` is ``None``), oldest first, and
        ``next_before_sequence`` for the older page. Loads only the page's instances."""
        limit = min(max(limit, 1), MAX_READ_MESSAGES)
        known = await self.get_message_range(session_id)
        read: AgentMessagesSlice | None = None
        for _ in range(_STALE_READ_ATTEMPTS):
            last = known.last_sequence if before is None else min(before - 1, known.last_sequence)
            first = max(known.first_retained_sequence, last - limit + 1)
            read = await self._read_messages(session_id, first, last, keep_newest=True)
            if read.complete:
                break
            known = read.message_range
        assert read is not None
        oldest = read.message_range.first_retained_sequence
        head = read.messages[0].sequence if read.messages else None
        return AgentMessagesBeforePage(
            messages=read.messages,
            next_before_sequence=head if head is not None and head > oldest else None,
            first_retained_sequence=oldest,
        )

    async def _read_messages(
        self, session_id: str, first: int, last: int, *, keep_newest: bool = False
    ) -> AgentMessagesSlice:
        if last < first:
            known = await self.get_message_range(session_id)
            return AgentMessagesSlice(messages=[], message_range=known)
        read: AgentMessagesSlice = await self.client.invoke_rpc(
            self.flow.read_agent_messages,
            session_id,
            ReadAgentMessagesRequest(
                first_sequence=first, last_sequence=last, keep_newest=keep_newest
            ),
            options=_loading(first, last),
        )
        return read

    async def read_message_text(
        self, session_id: str, sequence: int, part: int = 0
    ) -> MessageTextPart:
        """Platform addition: part ``part`` (zero-based) of message ``sequence``'s whole text,
        at most ``TEXT_PART_BYTES`` of UTF-8 (``dex_agents._text_parts``): a tool result the
        too long for its record is stored whole, and any stored text is read whole this way, however
        the snapshot and the message pages cut it.

        ``found`` is False for a message that is not stored (compaction may have deleted
        it); ``text`` is ``None`` when ``part`` is not below ``parts``. Loads the one message,
        then the one part.

        Raises:
            ValueError: If ``sequence`` is out of range or ``part`` is negative.
        """
        if part < 0:
            raise ValueError("part must not be negative")
        message = AGENT_MESSAGES.load(message_sequence_key(sequence))
        request = ReadMessageTextRequest(sequence=sequence, part=part)
        answer: MessageTextPart = await self.client.invoke_rpc(
            self.flow.read_message_text,
            session_id,
            request,
            options=RPCInvokeOptions(load_attribute_map_instances=(message,)),
        )
        key = answer.parts_key
        if key is None or answer.text is not None or part >= answer.parts:
            return answer
        answer = await self.client.invoke_rpc(
            self.flow.read_message_text,
            session_id,
            ReadMessageTextRequest(sequence=sequence, part=part, parts_key=key),
            options=RPCInvokeOptions(
                load_attribute_map_instances=(message, TEXT_PARTS.load(text_part_key(key, part)))
            ),
        )
        return answer

    async def stop_session(self, session_id: str) -> None:
        """Stop the session's Flow (``AsyncClient.stop_flow``); its state stays readable."""
        await self.client.stop_flow(session_id)


def _loading(first: int, last: int) -> RPCInvokeOptions:
    """Per-call loads of the ``AGENT_MESSAGES`` instances ``first..last``."""
    return RPCInvokeOptions(load_attribute_map_instances=message_loads(first, last))
