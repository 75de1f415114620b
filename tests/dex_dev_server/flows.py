# mypy: disable-error-code="override"
# (dex-python-sdk 1.23.0 types Step handlers as synchronous; async handlers are valid
# with Registry(allow_async_handlers=True) but do not match those stubs.)
"""Small Flows exercising the embedded engine through the real SDK (async handlers)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from dex import (
    AsyncContext,
    Attribute,
    AttributeIndex,
    AttributeMap,
    AttributeMapNotLoadedError,
    Channel,
    ChannelMap,
    ConditionCombination,
    Context,
    Flow,
    IndexType,
    PersistenceSchema,
    RetryPolicy,
    RPCResult,
    Step,
    StepDecision,
    StepList,
    StepMovement,
    StepOptions,
    Stream,
    SubFlow,
    Timer,
    Wait,
    WaitForFailurePolicy,
    dead_end,
    force_complete,
    force_fail,
    go_to,
    go_to_many,
    graceful_complete,
    rpc,
)

# --- ChainFlow: three Steps in a row -------------------------------------------------------

trail = Attribute("trail", str)


class ChainStart(Step[int]):
    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        trail.set(context, "start")
        return go_to(ChainMiddle, input + 1)


class ChainMiddle(Step[int]):
    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        trail.set(context, trail.get(context) + ">middle")
        return go_to(ChainEnd, input * 10)


class ChainEnd(Step[int]):
    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        trail.set(context, trail.get(context) + ">end")
        return graceful_complete(input)


class ChainFlow(Flow[int]):
    def get_steps(self) -> StepList[int]:
        return StepList.start_step(ChainStart()).other_steps(ChainMiddle(), ChainEnd())

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(trail)


# --- SignalFlow: wait on a channel (publish by RPC or PublishToChannel) ---------------------

signals = Channel("signals", str)


class WaitSignal(Step[None]):
    async def wait_for(self, context: AsyncContext, input: None) -> Wait:
        return Wait.until(signals.for_n(2))

    async def execute(self, context: AsyncContext, input: None) -> StepDecision:
        return graceful_complete("+".join(signals.results(context)))


class SignalFlow(Flow[None]):
    def get_steps(self) -> StepList[None]:
        return StepList.start_step(WaitSignal())

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(signals)

    @rpc
    async def send(self, context: Context, value: str) -> None:
        signals.publish(context, value)


# --- TimerFlow: a one-second timer, or a message, whichever comes first -------------------

wake = Channel("wake", str)


class Sleepy(Step[int]):
    async def wait_for(self, context: AsyncContext, input: int) -> Wait:
        return Wait.any_of(
            Timer.by_duration(timedelta(seconds=input), condition_id="nap"),
            wake.for_one(condition_id="woken"),
        )

    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        if context.has_timer_fired(0):
            return graceful_complete("timer")
        return graceful_complete("woken:" + wake.results(context)[0])


class TimerFlow(Flow[int]):
    def get_steps(self) -> StepList[int]:
        return StepList.start_step(Sleepy())

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(wake)


# --- FanOutFlow: go_to_many branches joined through a channel ------------------------------

done = Channel("done", int)
branch_results = AttributeMap("branch", int)


class FanOut(Step[int]):
    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        movements: list[StepMovement[int]] = [
            StepMovement.of(Branch, i) for i in range(1, input + 1)
        ]
        movements.append(StepMovement.of(Join, input))
        return go_to_many(*movements)


class Branch(Step[int]):
    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        await asyncio.sleep(0.3)
        branch_results.set(context, f"b{input}", input * input)
        done.publish(context, input)
        return dead_end()


class Join(Step[int]):
    async def wait_for(self, context: AsyncContext, input: int) -> Wait:
        return Wait.until(done.for_n(input))

    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        keys = sorted(branch_results.get_all_instance_keys(context))
        total = sum(branch_results.get(context, k) for k in keys)
        return graceful_complete(f"{sorted(done.results(context))}|{','.join(keys)}|{total}")


class FanOutFlow(Flow[int]):
    def get_steps(self) -> StepList[int]:
        return StepList.start_step(FanOut()).other_steps(
            Branch(),
            _with_options(Join(), StepOptions(execute_load_attribute_maps=(branch_results,))),
        )

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(done, branch_results)


def _with_options(step: Step[int], options: StepOptions) -> Step[int]:
    step.get_step_options = lambda: options  # type: ignore[method-assign]
    return step


# --- RetryFlow: flaky Step that succeeds on attempt 3; doomed Step with a failure route ----

attempts_seen = Attribute("attempts_seen", str)


class Flaky(Step[str]):
    def get_step_options(self) -> StepOptions:
        return StepOptions(
            execute_retry=RetryPolicy(
                initial_interval=timedelta(seconds=1),
                backoff_coefficient=1.0,
                maximum_attempts=5,
            )
        )

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:
        if context.attempt < 3:
            raise RuntimeError(f"flaky failure {context.attempt}")
        attempts_seen.set(context, f"flaky ok at {context.attempt}")
        return go_to(Doomed, input)


class Doomed(Step[str]):
    def get_step_options(self) -> StepOptions:
        return StepOptions(
            execute_retry=RetryPolicy(
                initial_interval=timedelta(seconds=1), maximum_attempts=2
            )
        ).on_execute_failure_proceed_to(Recover)

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:
        raise LookupError(f"doomed {input} attempt {context.attempt}")


class Recover(Step[str]):
    async def execute(self, context: AsyncContext, input: str) -> StepDecision:
        error = context.recovery_error
        detail = error.detail if error is not None else "none"
        return graceful_complete(f"recovered {input} from {detail}")


class RetryFlow(Flow[str]):
    def get_steps(self) -> StepList[str]:
        return StepList.start_step(Flaky()).other_steps(Doomed(), Recover())

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(attempts_seen)


class AlwaysFails(Step[None]):
    def get_step_options(self) -> StepOptions:
        return StepOptions(
            execute_retry=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=2)
        )

    async def execute(self, context: AsyncContext, input: None) -> StepDecision:
        raise RuntimeError("boom from AlwaysFails")


class FailingFlow(Flow[None]):
    def get_steps(self) -> StepList[None]:
        return StepList.start_step(AlwaysFails())


class Quitter(Step[str]):
    async def execute(self, context: AsyncContext, input: str) -> StepDecision:
        return force_fail(f"gave up on {input}")


class QuitFlow(Flow[str]):
    def get_steps(self) -> StepList[str]:
        return StepList.start_step(Quitter())


# --- CounterFlow: no start Step; RPCs with locks, maps and step scheduling -----------------

counter = Attribute("counter", int)
notes = AttributeMap("notes", str)
label = Attribute("label", str, index=AttributeIndex(IndexType.KEYWORD, "Label"))


class Finish(Step[int]):
    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        return graceful_complete(counter.get(context) + input)


class CounterFlow(Flow[None]):
    def get_steps(self) -> StepList[None]:
        return StepList.without_start_step(Finish())

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(counter, notes, label)

    @rpc
    async def set_label(self, context: Context, text: str) -> None:
        label.set(context, text)

    @rpc(lock_attributes=(counter.lock(),))
    async def increment(self, context: Context, pause_ms: int) -> RPCResult[int]:
        value = counter.get(context)
        await asyncio.sleep(pause_ms / 1000)
        counter.set(context, value + 1)
        return RPCResult(value + 1)

    @rpc
    async def read(self, context: Context) -> RPCResult[int]:
        return RPCResult(counter.get(context))

    @rpc
    async def note(self, context: Context, text: str) -> None:
        key, _, value = text.partition("=")
        if value:
            notes.set(context, key, value)
        else:
            notes.delete(context, key)

    @rpc
    async def note_repeated(self, context: Context, spec: str) -> None:
        """``key=text*count``: the note ``key`` is ``text`` repeated ``count`` times."""
        key, _, value = spec.partition("=")
        text, _, count = value.rpartition("*")
        notes.set(context, key, text * int(count))

    @rpc(load_attribute_maps=(notes,))
    async def list_notes(self, context: Context) -> RPCResult[str]:
        keys = sorted(notes.get_all_instance_keys(context))
        return RPCResult(";".join(f"{k}={notes.get(context, k)}" for k in keys))

    @rpc
    async def read_loaded_notes(self, context: Context, keys: str) -> RPCResult[str]:
        """Each comma-separated key as ``key=value`` (``key=None`` when absent), or ``key?``
        when the caller did not load it; ``*?`` when the whole map is not loaded."""
        shown = []
        for key in keys.split(","):
            try:
                shown.append(f"{key}={notes.get(context, key)}")
            except AttributeMapNotLoadedError:
                shown.append(f"{key}?")
        try:
            notes.get_all_instance_keys(context)
        except AttributeMapNotLoadedError:
            shown.append("*?")
        return RPCResult(";".join(shown))

    @rpc
    async def explode(self, context: Context) -> None:
        raise ValueError("rpc exploded")

    @rpc
    async def finish(self, context: Context, bonus: int) -> RPCResult[str]:
        return RPCResult("scheduled", (StepMovement.of(Finish, bonus),))


# --- StreamFlow: a Step writing to a Stream ------------------------------------------------

tokens = Stream("tokens", str, 1 << 20)


class Speaker(Step[int]):
    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        for i in range(input):
            tokens.write(context, f"token-{i}")
        return graceful_complete(input)


class StreamFlow(Flow[int]):
    def get_steps(self) -> StepList[int]:
        return StepList.start_step(Speaker())

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(tokens)


# --- DurableFlow: used across an engine SIGKILL ------------------------------------------

inbox = Channel("inbox", str)
progress = Attribute("progress", str)
slow_log = Stream("slow_log", str, 1 << 20)


class Prepare(Step[str]):
    async def execute(self, context: AsyncContext, input: str) -> StepDecision:
        progress.set(context, "prepared")
        return go_to(Slow, input)


class Slow(Step[str]):
    async def execute(self, context: AsyncContext, input: str) -> StepDecision:
        slow_log.write(context, f"slow started attempt {context.attempt}")
        progress.set(context, f"slow attempt {context.attempt}")
        if context.attempt == 1:
            await asyncio.sleep(3)
        return go_to(AwaitInbox, input)


class AwaitInbox(Step[str]):
    async def wait_for(self, context: AsyncContext, input: str) -> Wait:
        progress.set(context, "waiting")
        return Wait.all_of(
            inbox.for_n(3), Timer.by_duration(timedelta(seconds=1), condition_id="grace")
        )

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:
        return graceful_complete(f"{input}:" + ",".join(inbox.results(context)))


class DurableFlow(Flow[str]):
    def get_steps(self) -> StepList[str]:
        return StepList.start_step(Prepare()).other_steps(Slow(), AwaitInbox())

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(inbox, progress, slow_log)

    @rpc
    async def post(self, context: Context, text: str) -> None:
        inbox.publish(context, text)


# --- Timeouts, heartbeats, cancellation, wait_for failure, flow timeout ---------------------


class Sleeper(Step[None]):
    def get_step_options(self) -> StepOptions:
        return StepOptions(
            execute_method_timeout=timedelta(seconds=1),
            execute_retry=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3),
        )

    async def execute(self, context: AsyncContext, input: None) -> StepDecision:
        if context.attempt == 1:
            await context.heartbeat("checkpoint-1")
            await asyncio.sleep(30)
        previous = context.get_last_heartbeat_value(str)
        return graceful_complete(f"attempt {context.attempt} after {previous}")


class TimeoutFlow(Flow[None]):
    def get_steps(self) -> StepList[None]:
        return StepList.start_step(Sleeper())


never = Channel("never", str)


class Racer(Step[str]):
    async def wait_for(self, context: AsyncContext, input: str) -> Wait:
        if input == "slow":
            return Wait.until(never.for_one())
        return Wait.skip_immediately()

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:
        return graceful_complete(input).with_canceling_steps(Racer)


class RaceStart(Step[None]):
    async def execute(self, context: AsyncContext, input: None) -> StepDecision:
        return go_to_many(StepMovement.of(Racer, "slow"), StepMovement.of(Racer, "fast"))


class RaceFlow(Flow[None]):
    def get_steps(self) -> StepList[None]:
        return StepList.start_step(RaceStart()).other_steps(Racer())

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(never)


class BrokenWait(Step[None]):
    def get_step_options(self) -> StepOptions:
        return StepOptions(
            wait_for_retry=RetryPolicy(maximum_attempts=1),
            wait_for_failure=WaitForFailurePolicy.PROCEED,
        )

    async def wait_for(self, context: AsyncContext, input: None) -> Wait:
        raise RuntimeError("wait_for broke")

    async def execute(self, context: AsyncContext, input: None) -> StepDecision:
        error = context.recovery_error
        return graceful_complete(
            f"proceeded={context.wait_for_method_failed()} ({error.detail if error else ''})"
        )


class ProceedFlow(Flow[None]):
    def get_steps(self) -> StepList[None]:
        return StepList.start_step(BrokenWait())


class WaitForever(Step[None]):
    async def wait_for(self, context: AsyncContext, input: None) -> Wait:
        return Wait.until(never.for_one())

    async def execute(self, context: AsyncContext, input: None) -> StepDecision:
        return graceful_complete("never")


class ExpiringFlow(Flow[None]):
    def get_steps(self) -> StepList[None]:
        return StepList.start_step(WaitForever())

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(never)


# --- ComboFlow: any-combination waits over a Channel and a ChannelMap --------------------

approvals = Channel("approvals", str)
mailbox = ChannelMap("mailbox", str)


class Gate(Step[None]):
    def get_step_options(self) -> StepOptions:
        return StepOptions(execute_load_channel_maps=(mailbox,))

    async def wait_for(self, context: AsyncContext, input: None) -> Wait:
        return Wait.any_combination_of(
            ConditionCombination.of(
                approvals.for_one(condition_id="approval"),
                mailbox.for_one("alice", condition_id="alice"),
            ),
            ConditionCombination.of(mailbox.at_least("bob", 2, condition_id="bob")),
        )

    async def execute(self, context: AsyncContext, input: None) -> StepDecision:
        taken = (
            list(approvals.results(context))
            + list(mailbox.results(context, "alice"))
            + list(mailbox.results(context, "bob"))
        )
        left = {
            key: len(mailbox.pending_messages(context, key))
            for key in sorted(mailbox.get_all_instance_keys(context))
        }
        return graceful_complete(f"{taken} left={left}")


class ComboFlow(Flow[None]):
    def get_steps(self) -> StepList[None]:
        return StepList.start_step(Gate())

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(approvals, mailbox)


# --- Sub-flows and timeout handler ----------------------------------------------------------

# --- LockedFlow: parallel Steps that lock one Attribute for a read-modify-write -----------

tally = Attribute("tally", int)
bumped = Channel("bumped", int)


class LockedFanOut(Step[int]):
    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        movements: list[StepMovement[int]] = [
            StepMovement.of(LockedBump, i) for i in range(1, input + 1)
        ]
        movements.append(StepMovement.of(LockedJoin, input))
        return go_to_many(*movements)


class LockedBump(Step[int]):
    """Reads ``tally``, pauses, writes it back plus one: a lost update unless locked."""

    def get_step_options(self) -> StepOptions:
        return StepOptions(execute_lock_attributes=(tally.lock(),))

    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        value = tally.get(context) or 0
        await asyncio.sleep(0.2)
        tally.set(context, value + 1)
        bumped.publish(context, input)
        return dead_end()


class LockedJoin(Step[int]):
    async def wait_for(self, context: AsyncContext, input: int) -> Wait:
        return Wait.until(bumped.for_n(input))

    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        return graceful_complete(tally.get(context))


class LockedFlow(Flow[int]):
    def get_steps(self) -> StepList[int]:
        return StepList.start_step(LockedFanOut()).other_steps(LockedBump(), LockedJoin())

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(tally, bumped)


# --- GatedTimerFlow: a timer Step that GateKeeper schedules only once the test lets it -----

#: Per Flow ID, the Event a test sets to let GateKeeper's execute return (an Event binds to the
#: loop that waits on it, so each test makes its own).
gates: dict[str, asyncio.Event] = {}
#: Flow IDs whose GateKeeper execute is running, held by its gate.
gate_reached: set[str] = set()


class GateKeeper(Step[int]):
    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        gate_reached.add(context.flow_id)
        await gates[context.flow_id].wait()
        return go_to(GatedNap, input)


class GatedNap(Step[int]):
    async def wait_for(self, context: AsyncContext, input: int) -> Wait:
        return Wait.until(Timer.by_duration(timedelta(seconds=input), condition_id="gated-nap"))

    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        return graceful_complete("timer" if context.has_timer_fired(0) else "no timer")


class GatedTimerFlow(Flow[int]):
    def get_steps(self) -> StepList[int]:
        return StepList.start_step(GateKeeper()).other_steps(GatedNap())


CHAIN = ChainFlow()


class Delegate(Step[int]):
    async def wait_for(self, context: AsyncContext, input: int) -> Wait:
        return Wait.all_of(SubFlow.run(CHAIN, input), SubFlow.run(CHAIN, input + 1))

    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        outputs = [SubFlow.get_condition_results(context, i).single_output(int) for i in (0, 1)]
        return graceful_complete(f"{outputs} via {SubFlow.get_flow_id(context, 1)}")


class ParentFlow(Flow[int]):
    def get_steps(self) -> StepList[int]:
        return StepList.start_step(Delegate())


class HandledFlow(Flow[None]):
    def get_steps(self) -> StepList[None]:
        return StepList.start_step(WaitForever())

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(never)

    async def handle_timeout(self, context: AsyncContext) -> StepDecision:
        return force_complete("expired")


# --- HopFlow: a long chain whose every hop appends to one Attribute (used across kills) ----

hops = Attribute("hops", str)
HOP_PAUSE = 0.04


class Hop(Step[int]):
    """Appends its input to ``hops``; the last hop (input 0) completes with the whole trail."""

    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        await asyncio.sleep(HOP_PAUSE)
        trail_so_far = (hops.get(context) or "") + f"{input};"
        hops.set(context, trail_so_far)
        if input == 0:
            return graceful_complete(trail_so_far)
        return go_to(Hop, input - 1)


class HopFlow(Flow[int]):
    def get_steps(self) -> StepList[int]:
        return StepList.start_step(Hop())

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(hops)


# --- HeavyFlow: a Step whose loaded state is larger than a worker accepts in one message ----

cargo = AttributeMap("cargo", str)


def crate(index: int) -> str:
    """About 1 MiB, different for each index: five of them pass gRPC's 4 MiB limit."""
    return f"{index:02d}" + "x" * (1024 * 1024 - 258)


class LoadCargo(Step[str]):
    def get_step_options(self) -> StepOptions:
        return StepOptions(
            execute_retry=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=2),
            execute_load_attribute_maps=(cargo,),
        ).on_execute_failure_proceed_to(CargoTooLarge)

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:
        return graceful_complete(f"loaded {len(cargo.get_all_instance_keys(context))} crates")


class CargoTooLarge(Step[str]):
    async def execute(self, context: AsyncContext, input: str) -> StepDecision:
        error = context.recovery_error
        return graceful_complete(f"{error.error_type}: {error.detail}" if error else "none")


class HeavyFlow(Flow[str]):
    def get_steps(self) -> StepList[str]:
        return StepList.start_step(LoadCargo()).other_steps(CargoTooLarge())

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(cargo)


# --- LedgerFlow: every Step checks and rewrites blob-backed Attributes (used across kills) --

ledger = Attribute("ledger", str)
ledger_pages = AttributeMap("ledger_pages", str)
#: Characters of each page and Step input: over the 1024-byte blob threshold of the blob tests.
LEDGER_PAGE = 3000


def ledger_page(number: int) -> str:
    """``ledger`` after Step ``number``: a distinct value, so a distinct blob, per number."""
    return f"page-{number:03d}|" + "x" * LEDGER_PAGE


def ledger_input(number: int, last: int) -> str:
    """The (blob-backed) input of Step ``number`` of ``last``."""
    return f"{number}/{last}|" + "y" * LEDGER_PAGE


class Scribe(Step[str]):
    """Step ``n`` finds page ``n - 1`` in ``ledger``, writes page ``n`` there and as the map
    instance ``ledger_pages/n`` (the same content: one blob, two references), deletes
    instance ``n - 2``, and goes on to Step ``n + 1`` until the last."""

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:
        number, last = (int(part) for part in input.split("|", 1)[0].split("/"))
        found = ledger.get(context)
        expected = ledger_page(number - 1) if number > 1 else None
        if found != expected:
            return force_fail(f"step {number} found {(found or '')[:9]!r}")
        ledger.set(context, ledger_page(number))
        ledger_pages.set(context, str(number), ledger_page(number))
        if number > 2:
            ledger_pages.delete(context, str(number - 2))
        if number == last:
            return graceful_complete(f"{last} pages")
        return go_to(Scribe, ledger_input(number + 1, last))


class LedgerFlow(Flow[str]):
    def get_steps(self) -> StepList[str]:
        return StepList.start_step(Scribe())

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(ledger, ledger_pages)


# --- MovementOptionsFlow: one Step type whose movements carry their own retry and timeout ---
# The registered options allow five attempts and no method timeout; each movement narrows
# them, as dex_agents' tool Steps do per tool policy (issue 23).

_ONE_SECOND = timedelta(seconds=1)


def _bounded_movement(input: str, options: StepOptions) -> StepMovement[str]:
    return StepMovement.of(
        Bounded, input, options=options.on_execute_failure_proceed_to(BoundedFailed)
    )


class BoundedStart(Step[str]):
    async def execute(self, context: AsyncContext, input: str) -> StepDecision:
        once = StepOptions(execute_retry=RetryPolicy(_ONE_SECOND, maximum_attempts=1))
        return go_to_many(_bounded_movement("once", once))


class Bounded(Step[str]):
    def get_step_options(self) -> StepOptions:
        return StepOptions(
            execute_retry=RetryPolicy(_ONE_SECOND, backoff_coefficient=1.0, maximum_attempts=5)
        ).on_execute_failure_proceed_to(BoundedFailed)

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:
        if input == "once":
            raise RuntimeError(f"once failed on attempt {context.attempt}")
        if context.attempt < 3:
            await asyncio.sleep(30)  # cut off by the movement's 1 s method timeout
        # Reached only if the engine ran the Step's registered options (no timeout, 5 attempts).
        return graceful_complete(f"slow done on attempt {context.attempt}")


class BoundedFailed(Step[str]):
    async def execute(self, context: AsyncContext, input: str) -> StepDecision:
        error = context.recovery_error
        detail = error.detail if error is not None else "none"
        if input == "slow":
            return graceful_complete(f"slow failed: {detail}")
        slow = StepOptions(
            execute_method_timeout=_ONE_SECOND,
            execute_retry=RetryPolicy(_ONE_SECOND, maximum_attempts=2),
        )
        return go_to_many(_bounded_movement("slow", slow))


class MovementOptionsFlow(Flow[str]):
    def get_steps(self) -> StepList[str]:
        return StepList.start_step(BoundedStart()).other_steps(Bounded(), BoundedFailed())


SIGNAL = SignalFlow()
TIMER = TimerFlow()
FAN_OUT = FanOutFlow()
RETRY = RetryFlow()
FAILING = FailingFlow()
QUIT = QuitFlow()
COUNTER = CounterFlow()
STREAM = StreamFlow()
DURABLE = DurableFlow()
TIMEOUT = TimeoutFlow()
RACE = RaceFlow()
PROCEED = ProceedFlow()
EXPIRING = ExpiringFlow()
PARENT = ParentFlow()
HANDLED = HandledFlow()
COMBO = ComboFlow()
HOP = HopFlow()
HEAVY = HeavyFlow()
LOCKED = LockedFlow()
MOVEMENT_OPTIONS = MovementOptionsFlow()
LEDGER = LedgerFlow()
GATED_TIMER = GatedTimerFlow()

ALL_FLOWS: list[Flow[Any]] = [
    CHAIN,
    SIGNAL,
    TIMER,
    FAN_OUT,
    RETRY,
    FAILING,
    QUIT,
    COUNTER,
    STREAM,
    DURABLE,
    TIMEOUT,
    RACE,
    PROCEED,
    EXPIRING,
    PARENT,
    HANDLED,
    COMBO,
    HOP,
    HEAVY,
    LOCKED,
    MOVEMENT_OPTIONS,
    LEDGER,
    GATED_TIMER,
]
