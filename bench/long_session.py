"""A long agent session for ``bench.engine --long-session``, and its Worker child.

``LongSessionFlow`` is the platform's ``AgentSessionFlow`` (compaction on, so
``AgentSessionClient.get_agent_snapshot`` reads ``get_message_range`` and then
``get_agent_snapshot_page`` with the last 200 messages' ``AGENT_MESSAGES`` instances, as the
platform's reads do) plus one bench-only RPC, ``seed_messages``, which stores a batch of
messages and the new ``AGENT_STATE.message_count`` in one commit. A session of 20,000 messages
is built in seconds that way instead of in thousands of model turns; the engine stores each
message as a RunModel Step stores it (an ``AGENT_MESSAGES`` instance, in a blob when its value
passes the engine's ``--blob-threshold``).

Each message is unique (its sequence is in its text, so no two share a blob), ``text_chars``
characters long, and its framework item carries the text again, as a LiteLLM runner's item
does: with the default 1,000 characters a stored value is about 2.1 KB, over a 1,024-byte
threshold and under the default 64 KiB one.

Run as the Worker child: ``python -m bench.long_session`` (``DEX_SERVER_ADDRESS`` set, as
``dex_agents.testing.AgentTestStack.start_worker`` does).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dex import Context, RPCResult, rpc

from dex_agents import (
    AGENT_MESSAGES,
    AGENT_STATE,
    AgentMessage,
    AgentSessionFlow,
    AgentSessionOptions,
    AgentState,
    AgentStatus,
    CompactionOptions,
    MessageRole,
    message_sequence_key,
)

FLOW_TYPE = "BenchLongSession"
#: The roles messages take in turn: a user message, a model reply, a tool result.
_ROLES = (MessageRole.USER, MessageRole.ASSISTANT, MessageRole.TOOL)


@dataclass(frozen=True)
class SeedBatch:
    """``seed_messages``' request: store messages ``first..first + count - 1``.

    Attributes:
        first: The first new sequence; must be the session's ``message_count + 1``.
        count: How many messages to store.
        text_chars: Characters of each message's text.
    """

    first: int
    count: int
    text_chars: int


def seeded_message(sequence: int, text_chars: int) -> AgentMessage:
    """The bench's message ``sequence``: unique text of ``text_chars`` characters."""
    role = _ROLES[(sequence - 1) % len(_ROLES)]
    head = f"message {sequence} ({role}): "
    text = (head + "lorem ipsum dolor sit amet " * (text_chars // 27 + 1))[:text_chars]
    return AgentMessage(
        sequence=sequence,
        role=role,
        text=text,
        framework_item={"role": str(role), "content": text},
        turn_id=f"turn-{(sequence - 1) // len(_ROLES) + 1}",
    )


class LongSessionFlow(AgentSessionFlow):
    """The platform's session Flow with ``seed_messages`` (bench only)."""

    @rpc(lock_attributes=(AGENT_STATE.lock(),))
    def seed_messages(self, context: Context, batch: SeedBatch) -> RPCResult[int]:
        """Store ``batch``'s messages and advance ``message_count``; returns the new count.

        Raises:
            ValueError: If ``batch.first`` does not follow the stored messages.
        """
        state = AGENT_STATE.get(context) or AgentState(AgentStatus.WAITING_FOR_USER_MESSAGE)
        if batch.first != state.message_count + 1:
            raise ValueError(f"next sequence is {state.message_count + 1}, not {batch.first}")
        last = batch.first + batch.count - 1
        for sequence in range(batch.first, last + 1):
            AGENT_MESSAGES.set(
                context, message_sequence_key(sequence), seeded_message(sequence, batch.text_chars)
            )
        AGENT_STATE.set(context, replace(state, message_count=last))
        return RPCResult(last)


def build_flow() -> LongSessionFlow:
    """The bench's Flow, with the scripted runner (no model is called: no turn runs)."""
    from tests.dex_agents.scripted_agent import ScriptedRunner

    return LongSessionFlow(
        ScriptedRunner(FLOW_TYPE),
        flow_type=FLOW_TYPE,
        options=AgentSessionOptions(compaction=CompactionOptions()),
    )


if __name__ == "__main__":
    from dex_agents.testing import run_agent_worker

    run_agent_worker([build_flow()])
