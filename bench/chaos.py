"""Chaos suite: kill the platform's processes at random moments and count what survived.

Starts what ``make run`` starts, as real processes on a temporary data directory
(``tests/e2e/relay_stack.py``: the embedded Dex engine, the demo model, uvicorn, a Celery
worker, plus Celery beat and ``--workers`` ``manage.py dexworker`` processes), plays the part
of a supervisor (a killed process is started again at once), and runs four scenarios:

1. ``worker``: ``--sessions`` sessions run turns in a loop, each turn calling a read
   (``search__web_search``), an idempotent write (``docs__create_document``, keyed by title) and a
   gated non-idempotent write (``slack__post_message``, approved by a staff client), while Dex
   workers are SIGKILLed ``--kills`` times at random moments. Counts finished sessions, lost and
   duplicated user messages (REST), tool-call outcomes (the snapshots' records), duplicate posts
   (the demo Slack server's own ``slack_messages.json``; each explained), writes recorded as
   succeeded that left no trace, and MCP server processes the killed workers left behind.
2. ``engine``: ``--engine-kills`` times, a turn is started on every session, the committed state
   is read (messages and completed Steps), the engine is SIGKILLed mid-turn and restarted on the
   same database; what was read must still be there and every turn must finish.
3. ``web``: ``--ws-clients`` clients hold a websocket each and post ``--ws-messages`` messages
   while uvicorn is SIGKILLed ``--web-kills`` times; every accepted message (201/202) must be in
   its session, and each client's events (resumed with ``?after=<last token>``) must equal the
   session's whole AgentEvents Stream, read again at the end: no gap, no repeat.
4. ``mcp``: ``--mcp-cycles`` stdio connect/close cycles of the worker's MCP client
   (``mcp_registry.client.list_tools`` on the demo search server) with this process's file
   descriptors sampled, a server that never answers ``initialize`` (abandoned after
   ``--init-timeout``), and a SIGKILLed worker whose MCP server processes must all end.

Writes ``docs/reliability.md`` (``--output``) from the run: date, machine, configuration, one
table per scenario. Run: ``make chaos`` (the issue's figures), or
``.venv/bin/python -m bench.chaos --quick`` (a few minutes). Not part of CI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench._cli import positive_float, positive_int
from bench.chaos_report import ChaosReport, Machine, Row, ScenarioResult, report_render
from tests.processes import marked_pids

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = ("worker", "engine", "web", "mcp")
# Marks the MCP server processes this suite starts itself, wherever they end up in /proc.
RUN_MARK_ENV = "DEXAGENTS_CHAOS_RUN"


# --- processes, from /proc -------------------------------------------------------------


@dataclass(frozen=True)
class ProcessId:
    """A process as seen once: ``pid`` plus its start time in clock ticks, which tells it
    apart from a later process that reuses the pid."""

    pid: int
    start: int
    command: str


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, ppid, start time)`` of ``pid`` from ``/proc/<pid>/stat``, None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[19])


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200]


def process_descendants(pid: int) -> list[ProcessId]:
    """Every live descendant of ``pid`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[1], []).append(int(entry.name))
    found: list[ProcessId] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        if (stat := _stat(child)) is not None:
            found.append(ProcessId(child, stat[2], _command(child)))
            todo += children.get(child, [])
    return found


def processes_marked(mark: str) -> list[ProcessId]:
    """Live processes whose environment holds ``RUN_MARK_ENV=mark``."""
    found: list[ProcessId] = []
    for pid in marked_pids(RUN_MARK_ENV, mark):
        stat = _stat(pid)
        process = ProcessId(pid, stat[2] if stat else 0, _command(pid))
        if process_running(process):
            found.append(process)
    return found


def process_running(process: ProcessId) -> bool:
    """Whether ``process`` still runs (a zombie does not: it only waits to be reaped)."""
    stat = _stat(process.pid)
    return stat is not None and stat[2] == process.start and stat[0] != "Z"


def fd_count(pid: int) -> int:
    """Open file descriptors of ``pid`` (``/proc/<pid>/fd``)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


async def poll(probe: Callable[[], Awaitable[bool]], within: float,
               interval: float = 0.5) -> bool:
    """Await ``probe`` until it is true or ``within`` seconds passed; its last answer."""
    deadline = time.monotonic() + within
    while True:
        if await probe():
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval)


# --- the platform ------------------------------------------------------------------------


@dataclass
class WorkerKill:
    """One SIGKILLed Dex worker: when (UTC), its pid, and the processes it had started."""

    at: datetime
    pid: int
    tree: list[ProcessId]


class Platform:
    """The running stack, with the supervisor's part: restart what was killed.

    ``stack`` is a ``tests.e2e.relay_stack.Stack`` (kept untyped here so this module imports
    without Django for the report's tests).
    """

    def __init__(self, stack: Any, *, workers: int, worker_slots: int) -> None:
        self.stack = stack
        self.worker_slots = worker_slots
        self.var_dir = Path(stack.env["DEXAGENTS_VAR_DIR"])
        self.workers = [proc for proc in stack.processes.started if proc.name == "worker"]
        self.kills: list[WorkerKill] = []
        self.exited_unkilled = 0
        from tests.e2e.conftest import PYTHON

        # Celery beat, as ``make run`` has it: its periodic sweep delivers an outbox row whose
        # web process died before the row's first delivery attempt.
        beat = stack.processes.start("beat", [PYTHON, "-m", "celery", "-A", "dexagents_site",
                                              "beat", "--loglevel=INFO", "--pidfile="])
        while len(self.workers) < workers:
            self.worker_start()
        for proc in self.workers:
            proc.wait_for_line("dexworker ready", timeout=180)
        beat.wait_for_line("beat: Starting...", timeout=180)

    def worker_start(self) -> Any:
        """Start one more ``manage.py dexworker`` (not waiting for it to be ready)."""
        from tests.e2e.conftest import PYTHON

        proc = self.stack.processes.start("worker", [
            PYTHON, "manage.py", "dexworker", "--max-concurrent-tasks", str(self.worker_slots)])
        self.workers.append(proc)
        return proc

    def workers_ready(self) -> list[Any]:
        """Workers that run and printed their ready line."""
        return [proc for proc in self.workers if proc.popen.poll() is None
                and any("dexworker ready" in line for line in list(proc.lines))]

    def worker_kill(self, proc: Any) -> WorkerKill:
        """SIGKILL the worker process only (as a crash would; its MCP servers' guards must
        notice), after noting the processes it started."""
        tree = process_descendants(proc.popen.pid)
        kill = WorkerKill(datetime.now(UTC), proc.popen.pid, tree)
        os.kill(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait()
        self.workers.remove(proc)
        self.kills.append(kill)
        return kill

    def workers_replace_exited(self) -> int:
        """Start a worker for each one that exited on its own; how many were replaced."""
        gone = [proc for proc in self.workers if proc.popen.poll() is not None]
        for proc in gone:
            self.workers.remove(proc)
            self.worker_start()
        self.exited_unkilled += len(gone)
        return len(gone)

    def engine_kill_restart(self) -> float:
        """SIGKILL the engine, start it again on the same database; seconds until ready."""
        engine = self.stack.engine
        engine.signal_group(signal.SIGKILL)
        engine.popen.wait()
        started = time.monotonic()
        self.stack.start_engine().wait_for_line("dex_dev_server ready on", timeout=120)
        return time.monotonic() - started

    def web_kill_restart(self) -> float:
        """SIGKILL uvicorn, start it again on the same port; seconds until it serves."""
        web = self.stack.web
        web.signal_group(signal.SIGKILL)
        web.popen.wait()
        started = time.monotonic()
        self.stack.web = self.stack.start_web(self.stack.web_port)
        self.stack.web.wait_for_line("Application startup complete", timeout=120)
        return time.monotonic() - started


class Api:
    """One persona's REST client. Reads are repeated through dropped connections and 503s
    (a restarting part) for up to ``read_timeout`` seconds; writes are sent once."""

    def __init__(self, base_url: str, headers: dict[str, str],
                 read_timeout: float = 180.0) -> None:
        import httpx

        self.client = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60,
                                        limits=httpx.Limits(keepalive_expiry=2.0))
        self.read_timeout = read_timeout

    async def get(self, path: str) -> Any:
        import httpx

        deadline = time.monotonic() + self.read_timeout
        while True:
            try:
                answer = await self.client.get(path)
                if answer.status_code not in (502, 503, 504):
                    answer.raise_for_status()
                    return answer.json()
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"GET {path} kept failing for {self.read_timeout:.0f} s")
            await asyncio.sleep(0.5)

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """``(status, JSON body)``; raises ``httpx.TransportError`` when no answer came."""
        answer = await self.client.post(path, json=body)
        try:
            return answer.status_code, answer.json()
        except ValueError:
            return answer.status_code, answer.text

    async def post_until_accepted(self, path: str, body: dict[str, Any]) -> Any:
        """POST, repeating a 503 (nothing taken) for up to ``read_timeout`` seconds."""
        deadline = time.monotonic() + self.read_timeout
        while True:
            status, data = await self.post(path, body)
            if status in (200, 201, 202):
                return data
            if status != 503 or time.monotonic() > deadline:
                raise RuntimeError(f"POST {path}: {status} {data}")
            await asyncio.sleep(1.0)

    async def messages(self, session_id: str) -> list[dict[str, Any]]:
        """Every retained message of the session, oldest first (all pages)."""
        path: str | None = f"/api/v1/sessions/{session_id}/messages/?limit=200"
        found: list[dict[str, Any]] = []
        while path:
            page = await self.get(path)
            found = page["messages"] + found
            path = page.get("next")
        return found

    async def aclose(self) -> None:
        await self.client.aclose()


def user_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [str(message.get("text")) for message in messages if message.get("role") == "user"]


async def turn_wait(api: Api, session_id: str, text: str, within: float,
                    calls: dict[tuple[str, str], dict[str, Any]] | None = None,
                    interval: float = 1.5,
                    seen: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Poll the snapshot until the turn that ``text`` started is over; the last snapshot, or
    None after ``within`` seconds. Tool-call records seen on the way go to ``calls``; what the
    polls saw (reads that timed out, the last snapshot's status, its last messages) goes to
    ``seen``, to explain a turn that did not finish."""
    deadline = time.monotonic() + within
    seen = {} if seen is None else seen
    seen.update(polls=0, timeouts=0)
    while time.monotonic() < deadline:
        seen["polls"] += 1
        try:
            snapshot = await api.get(f"/api/v1/sessions/{session_id}/")
        except TimeoutError:
            seen["timeouts"] += 1
            await asyncio.sleep(interval)
            continue
        if calls is not None:
            for call in snapshot.get("tool_calls") or []:
                calls[(str(call.get("turn_id")), str(call.get("tool_call_id")))] = call
        messages = snapshot.get("messages") or []
        users = user_texts(messages)
        seen.update(
            status=snapshot.get("status"),
            sent_is_last_user_message=bool(users) and users[-1] == text,
            last_messages=[f"{message.get('role')}: {str(message.get('text'))[:50]!r}"
                           for message in messages[-3:]],
        )
        # Over: answered, or failed (``last_turn_error``; a failure after tools ran appends the
        # turn-failure note as a user message, so the text sent is then the one before it).
        if (snapshot.get("status") == "waiting_for_user_message"
                and not snapshot.get("queued_messages") and text in users[-2:]
                and ((users[-1] == text and messages[-1].get("role") == "assistant")
                     or snapshot.get("last_turn_error"))):
            return dict(snapshot)
        await asyncio.sleep(interval * random.uniform(0.7, 1.3))
    return None


async def _stuck_state(api: Api, session_id: str) -> str:
    """What a session that stopped moving shows: its status, its tool calls' statuses, its
    pending approvals and queued messages (the outbox's included)."""
    try:
        snapshot = await api.get(f"/api/v1/sessions/{session_id}/")
    except Exception as error:
        return f"its snapshot could not be read ({type(error).__name__})"
    calls = Counter(str(call.get("status")) for call in snapshot.get("tool_calls") or [])
    queued = snapshot.get("queued_messages") or []
    return (f"status `{snapshot.get('status')}`, tool calls "
            + (", ".join(f"{status}: {count}" for status, count in sorted(calls.items()))
               or "none")
            + f", pending interrupts {len(snapshot.get('pending_interrupts') or [])}, queued "
            f"messages {len(queued)} ("
            + ", ".join(str(entry.get("delivery", "delivered")) for entry in queued) + ")")


def _helpers_state(platform: Platform) -> tuple[int, list[str]]:
    """How many of the Celery worker and beat still run, and notes on those that do not."""
    running, notes = 0, []
    for proc in platform.stack.processes.started:
        if proc.name not in ("celery", "beat"):
            continue
        if proc.popen.poll() is None:
            running += 1
            continue
        tail = " / ".join(line.strip() for line in list(proc.lines)[-3:])
        notes.append(f"the Celery {proc.name} process exited ({proc.popen.returncode}); its "
                     f"last lines: {tail}")
    return running, notes


async def approvals_run(staff: Api, stop: asyncio.Event, answers: Counter[int]) -> None:
    """Approve every pending approval, as a reviewer watching the dashboard would."""
    import httpx

    while not stop.is_set():
        try:
            pending = await staff.get("/api/v1/approvals/")
        except TimeoutError:
            continue
        for item in pending:
            if item.get("state", "pending") != "pending":
                continue
            url = f"/api/v1/sessions/{item['session']}/interrupts/{item['interrupt_id']}/"
            try:
                status, _ = await staff.post(url, {"approved": True})
            except httpx.TransportError:
                status = 0
            answers[status] += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)


# --- scenario 1: Dex worker SIGKILLs -----------------------------------------------------


@dataclass
class SessionRun:
    """What one session of the worker scenario sent and saw."""

    number: int
    session_id: str = ""
    sent: list[str] = field(default_factory=list)
    answered: int = 0
    failed_turns: list[str] = field(default_factory=list)
    calls: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    error: str = ""


def tools_message(tag: str, slow: float) -> str:
    """A turn that calls a read, an idempotent write and a non-idempotent write, each with
    arguments unique to ``tag`` so its side effects can be counted in the servers' records."""
    search = json.dumps({"query": f"chaos {tag}"})
    document = json.dumps({"title": f"chaos {tag}", "body": "written by the chaos suite"})
    post = json.dumps({"channel": "general", "text": f"chaos {tag}"})
    return (f"/slow {slow}\n/tool search__web_search {search}\n"
            f"/tool docs__create_document {document}\n/tool slack__post_message {post}")


async def session_turns(owner: Api, run: SessionRun, stop: asyncio.Event,
                        args: argparse.Namespace) -> None:
    """Run turns on one session until ``stop`` is set (at least one)."""
    turn = 0
    phase = "create"
    try:
        text = tools_message(f"w{run.number}.{turn}", args.slow)
        created = await owner.post_until_accepted("/api/v1/sessions/",
                                                  {"agent": "demo", "message": text})
        run.session_id = str(created["id"])
        run.sent.append(text)
        while True:
            phase = f"turn {turn}"
            seen: dict[str, Any] = {}
            snapshot = await turn_wait(owner, run.session_id, text, args.turn_timeout, run.calls,
                                       seen=seen)
            if snapshot is None:
                run.error = (f"turn {turn} did not finish within {args.turn_timeout:.0f} s; "
                             + await _stuck_state(owner, run.session_id)
                             + f"; its polls: {seen}")
                return
            run.answered += 1
            if snapshot.get("last_turn_error"):
                error = " ".join(str(snapshot["last_turn_error"]).split())
                run.failed_turns.append(error[:200])
            if stop.is_set():
                return
            turn += 1
            text = tools_message(f"w{run.number}.{turn}", args.slow)
            await owner.post_until_accepted(f"/api/v1/sessions/{run.session_id}/messages/",
                                            {"text": text})
            run.sent.append(text)
    except Exception as error:
        run.error = f"{phase}: {type(error).__name__}: {error}"[:300]


def _state_file(platform: Platform, name: str, default: Any) -> Any:
    path = platform.var_dir / "demo_mcp" / name
    return json.loads(path.read_text()) if path.exists() else default


async def scenario_worker(platform: Platform, owner: Api, staff: Api,
                          args: argparse.Namespace, rng: random.Random) -> ScenarioResult:
    result = ScenarioResult(
        "Dex worker SIGKILL at random moments",
        f"{args.sessions} sessions run turns in a loop on {args.workers} Dex workers while a "
        f"random worker is SIGKILLed {args.kills} times and a new one is started at once; "
        f"each kill comes {args.kill_gap[0]:g} to {args.kill_gap[1]:g} s after the previous "
        "replacement printed its ready line, so at most one worker is down at a time. "
        "Each turn calls "
        "`search__web_search` (read), `docs__create_document` (idempotent write, keyed by "
        "title) and `slack__post_message` (non-idempotent write, approved by a staff client "
        "polling `GET /api/v1/approvals/`); each call's arguments are unique, so the demo "
        "servers' own files (`slack_messages.json`, `docs_documents.json`) show how often it "
        "ran. Goal for duplicates: 0. A SIGKILLed worker's stream is cut, so Dex fails that "
        "attempt (a single-attempt write then ends `outcome_unknown`) instead of running it "
        "again; the one redelivery window left is a worker that half-closed its stream cleanly "
        "after the tool ran but before Dex received its output (Dex hands the task to another "
        "worker at the same attempt), which a SIGKILL does not produce.")
    stop = asyncio.Event()
    approvals_stop = asyncio.Event()
    answers: Counter[int] = Counter()
    approver = asyncio.create_task(approvals_run(staff, approvals_stop, answers))
    runs = [SessionRun(number) for number in range(args.sessions)]
    drivers = [asyncio.create_task(session_turns(owner, run, stop, args)) for run in runs]
    async def all_ready() -> bool:
        platform.workers_replace_exited()
        return len(platform.workers_ready()) == len(platform.workers)

    while len(platform.kills) < args.kills:
        # At most one worker is down at a time, so the sessions keep moving between kills
        # (killing each replacement as soon as it is ready stalled every session on a loaded
        # machine); a kill lands a random moment after the last replacement became ready.
        await poll(all_ready, args.turn_timeout, interval=0.2)
        await asyncio.sleep(rng.uniform(*args.kill_gap))
        if ready := platform.workers_ready():
            platform.worker_kill(rng.choice(ready))
            platform.worker_start()
            print(f"  worker SIGKILL {len(platform.kills)}/{args.kills}", flush=True)
    stop.set()
    await asyncio.gather(*drivers)
    approvals_stop.set()
    await approver

    # Messages: every accepted one is in its session, once.
    lost = duplicated = 0
    for run in runs:
        if not run.session_id:
            continue
        present = Counter(user_texts(await owner.messages(run.session_id)))
        lost += sum(1 for text in run.sent if present[text] == 0)
        duplicated += sum(count - 1 for text, count in present.items()
                          if text in run.sent and count > 1)

    # Tool calls, from the snapshots' records, against the servers' own records.
    posts = _state_file(platform, "slack_messages.json", [])
    documents = _state_file(platform, "docs_documents.json", {})
    posted: dict[str, list[str]] = {}
    for post in posts:
        posted.setdefault(str(post["text"]), []).append(str(post["posted_at"]))
    statuses: Counter[str] = Counter()
    unknown_by_tool: Counter[str] = Counter()
    #: ``outcome_unknown`` writes whose effect is in the server's own file, by tool.
    unknown_done: Counter[str] = Counter()
    succeeded_without_trace = 0
    posts_expected: dict[str, tuple[SessionRun, dict[str, Any]]] = {}
    for run in runs:
        for call in run.calls.values():
            status = str(call.get("status"))
            statuses[status] += 1
            if status == "outcome_unknown":
                unknown_by_tool[str(call.get("tool_name"))] += 1
            arguments = json.loads(str(call.get("arguments") or "{}"))
            tool = call.get("tool_name")
            if tool == "slack__post_message":
                posts_expected[str(arguments.get("text"))] = (run, call)
            if tool not in ("slack__post_message", "docs__create_document"):
                continue
            # Whether the server's own file shows the write done.
            done = (bool(posted.get(str(arguments.get("text"))))
                    if tool == "slack__post_message"
                    else str(arguments.get("title")) in documents)
            if status == "outcome_unknown" and done:
                unknown_done[str(tool)] += 1
            if status == "succeeded" and not done:
                succeeded_without_trace += 1

    in_window = outside = 0
    for text, times in sorted(posted.items()):
        if len(times) < 2 or text not in posts_expected:
            continue
        run, call = posts_expected[text]
        first, last = min(times), max(times)
        between = [kill for kill in platform.kills if first <= kill.at.isoformat() <= last]
        explained = bool(between) and call.get("status") == "succeeded"
        if explained:
            in_window += len(times) - 1
        else:
            outside += len(times) - 1
        kills = ", ".join(f"worker pid {kill.pid} at {kill.at:%H:%M:%S.%f}"[:-3]
                          for kill in between) or "no worker SIGKILL"
        result.notes.append(
            f"`{text}` (session {run.session_id}, call {call.get('tool_call_id')}) was posted "
            f"{len(times)} times, first at {first[11:23]}, last at {last[11:23]}; between them: "
            f"{kills}; the call's record says `{call.get('status')}`. " + (
                "Inside the documented window: the killed worker had run the tool, Dex had "
                "received no output of that attempt, so it redelivered the task at the same "
                "attempt and the new worker ran it again." if explained else
                "Outside the documented window: not explained by a redelivery."))

    await asyncio.sleep(0)
    orphans = await _orphans_after(platform.kills, args.orphan_grace)
    sessions_done = sum(1 for run in runs if run.session_id and not run.error
                        and run.answered == len(run.sent))
    sent = sum(len(run.sent) for run in runs)
    result.rows.append(_ratio("sessions finished (every message answered)", sessions_done,
                              args.sessions))
    result.count("worker SIGKILLs", len(platform.kills))
    result.count("workers that exited without a kill (started again)", platform.exited_unkilled)
    result.count("user messages accepted", sent)
    result.count("turns answered", sum(run.answered for run in runs))
    result.count("turns that ended with an error (`last_turn_error`)",
                 sum(len(run.failed_turns) for run in runs))
    result.count("lost messages", lost, 0)
    result.count("messages stored twice", duplicated, 0)
    result.count("tool calls", sum(statuses.values()))
    for status, count in sorted(statuses.items()):
        result.count(f"tool calls `{status}`", count)
    for tool, count in sorted(unknown_by_tool.items()):
        result.count(f"`outcome_unknown` of `{tool}`", count)
        result.count(f"`outcome_unknown` of `{tool}` that the server's file shows done",
                     unknown_done[tool])
    result.count("non-idempotent posts (`slack_messages.json`)", len(posts))
    result.count("duplicate posts inside the redelivery window", in_window)
    result.count("duplicate posts outside the redelivery window", outside, 0)
    result.count("writes recorded `succeeded` with no trace in the server's file",
                 succeeded_without_trace, 0)
    result.count("MCP server processes left running by killed workers", len(orphans), 0)
    result.count("approval decisions sent", sum(answers.values()))
    helpers_running, helper_notes = _helpers_state(platform)
    result.rows.append(_ratio("Celery worker and beat still running at the end",
                              helpers_running, 2))
    result.notes += helper_notes
    result.notes += [f"session {run.session_id or run.number}: {run.error}"
                     for run in runs if run.error][:10]
    result.notes += [f"orphan: pid {process.pid} `{process.command}`" for process in orphans]
    result.notes += failed_turn_notes([text for run in runs for text in run.failed_turns])
    if answers:
        result.notes.append("Approval answers by status: " + ", ".join(
            f"{status}: {count}" for status, count in sorted(answers.items())) + ".")
    return result


def failed_turn_notes(errors: list[str]) -> list[str]:
    """One report note per distinct ``last_turn_error`` text, most frequent first (10 at most,
    then one counting the rest), so a failed turn in the table comes with its reason."""
    counts = Counter(errors).most_common()
    notes = [f"{count} turn{'s' if count > 1 else ''} ended with the error: {text}"
             for text, count in counts[:10]]
    if len(counts) > 10:
        notes.append(f"{sum(count for _, count in counts[10:])} more turns ended with"
                     f" {len(counts) - 10} other errors.")
    return notes


def _ratio(measure: str, done: int, total: int) -> Row:
    return Row(measure, f"{done} / {total}", f"{total} / {total}", done == total)


async def _orphans_after(kills: list[WorkerKill], grace: float) -> list[ProcessId]:
    """Processes the killed workers had started that still run ``grace`` seconds after the
    last kill (each server's guard stops its group within ~2.2 s of the worker's death)."""
    tree = [process for kill in kills for process in kill.tree]

    async def all_gone() -> bool:
        return not any(process_running(process) for process in tree)

    await poll(all_gone, grace)
    return [process for process in tree if process_running(process)]


# --- scenario 2: engine SIGKILL + restart ------------------------------------------------


async def scenario_engine(platform: Platform, owner: Api, args: argparse.Namespace,
                          rng: random.Random) -> ScenarioResult:
    result = ScenarioResult(
        "Engine SIGKILL and restart mid-turn",
        f"{args.engine_sessions} sessions; {args.engine_kills} times: a turn is started on each "
        "(`/slow` model answers and two read tools), the committed state of every session is "
        "read (its messages, and its completed Steps from `GET .../history/`), the engine is "
        "SIGKILLed right after that read and started again on the same SQLite file. Every "
        "message and completed Step read before the kill must be there after the restart, "
        "and every turn must finish.")
    sessions: list[str] = []
    for _ in range(args.engine_sessions):
        created = await owner.post_until_accepted("/api/v1/sessions/", {"agent": "demo"})
        sessions.append(str(created["id"]))
    lost_messages = lost_steps = unfinished = mid_turn = workers_replaced = 0
    restart_seconds: list[float] = []
    for round_number in range(args.engine_kills):
        texts: dict[str, str] = {}
        for number, session_id in enumerate(sessions):
            search = json.dumps({"query": f"engine {round_number}.{number}"})
            texts[session_id] = (f"/slow {args.slow}\n/tool search__web_search {search}\n"
                                 f"/tool slack__search_messages {json.dumps({'query': 'deploy'})}")
            await owner.post_until_accepted(f"/api/v1/sessions/{session_id}/messages/",
                                            {"text": texts[session_id]})
        await asyncio.sleep(rng.uniform(0.2, 2.0))
        before: dict[str, tuple[list[tuple[str, str]], Counter[tuple[str, str, int]]]] = {}
        running = False
        for session_id in sessions:
            snapshot = await owner.get(f"/api/v1/sessions/{session_id}/")
            running |= snapshot.get("status") in ("running_model", "running_tools")
            history = await owner.get(f"/api/v1/sessions/{session_id}/history/")
            before[session_id] = (_message_keys(await owner.messages(session_id)),
                                  _step_keys(history))
        mid_turn += running
        restart_seconds.append(await asyncio.to_thread(platform.engine_kill_restart))
        print(f"  engine SIGKILL {round_number + 1}/{args.engine_kills}"
              f"{' (mid-turn)' if running else ''}", flush=True)
        workers_replaced += platform.workers_replace_exited()
        for session_id in sessions:
            if await turn_wait(owner, session_id, texts[session_id], args.turn_timeout) is None:
                unfinished += 1
                result.notes.append(f"round {round_number}: session {session_id}'s turn did "
                                    f"not finish within {args.turn_timeout:.0f} s")
            messages, steps = before[session_id]
            after_messages = _message_keys(await owner.messages(session_id))
            after_steps = _step_keys(await owner.get(f"/api/v1/sessions/{session_id}/history/"))
            missing = [key for key in messages if key not in after_messages]
            lost_messages += len(missing)
            lost_steps += sum((steps - after_steps).values())
            if missing:
                result.notes.append(f"round {round_number}: session {session_id} lost "
                                    f"{len(missing)} messages: {missing[:3]}")
    result.count("engine SIGKILLs and restarts", args.engine_kills)
    result.count("kills while a turn was running (status read just before)", mid_turn)
    result.count("committed messages lost", lost_messages, 0)
    result.count("completed Steps lost", lost_steps, 0)
    result.count("turns not finished after the restart", unfinished, 0)
    result.count("workers that exited with the engine and were started again",
                 workers_replaced)
    if restart_seconds:
        result.rows.append(_seconds_row("engine restart until ready, max", max(restart_seconds)))
    return result


def _seconds_row(measure: str, seconds: float) -> Row:
    return Row(measure, f"{seconds:.1f} s")


def _message_keys(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(f"{message.get('sequence')}:{message.get('role')}", str(message.get("text")))
            for message in messages]


def _step_keys(history: list[dict[str, Any]]) -> Counter[tuple[str, str, int]]:
    return Counter((str(entry.get("step_execution_id")), str(entry.get("event_type")),
                    int(entry.get("final_attempt") or 0)) for entry in history)


# --- scenario 3: web SIGKILL under websockets --------------------------------------------


@dataclass
class WebClient:
    """One websocket client of the web scenario."""

    number: int
    session_id: str = ""
    tokens: list[str] = field(default_factory=list)
    accepted: list[str] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    reconnects: int = 0
    refused_connections: int = 0
    snapshot_required: int = 0
    error: str = ""


async def _relay_follow(platform: Platform, client: WebClient, headers: dict[str, str],
                        stop: asyncio.Event) -> None:
    """Hold the session's websocket, resuming after the last token whenever it drops."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import WebSocketException

    connected_once = False
    while not stop.is_set():
        after = client.tokens[-1] if client.tokens else None
        try:
            async with connect(platform.stack.events_url(client.session_id, after),
                               additional_headers=headers, open_timeout=30,
                               max_queue=None) as ws:
                if connected_once:
                    client.reconnects += 1
                connected_once = True
                while not stop.is_set():
                    try:
                        raw = await asyncio.wait_for(ws.recv(), timeout=0.5)
                    except TimeoutError:
                        continue
                    frame = json.loads(raw)
                    if frame.get("type") == "event":
                        client.tokens.append(str(frame["token"]))
                    elif frame.get("type") == "snapshot_required":
                        client.snapshot_required += 1
        except (OSError, WebSocketException, TimeoutError):
            await asyncio.sleep(0.3)


async def _stream_all(platform: Platform, session_id: str, headers: dict[str, str],
                      last: str | None) -> list[str]:
    """Every token of the session's AgentEvents Stream, oldest first, read on a new
    websocket until ``last`` arrived and nothing more came for 2 s."""
    from websockets.asyncio.client import connect

    tokens: list[str] = []
    async with connect(platform.stack.events_url(session_id), additional_headers=headers,
                       open_timeout=30, max_queue=None) as ws:
        while True:
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=2.0 if last in tokens
                                             or last is None else 30.0)
            except TimeoutError:
                return tokens
            frame = json.loads(raw)
            if frame.get("type") == "event":
                tokens.append(str(frame["token"]))


async def scenario_web(platform: Platform, owner: Api, args: argparse.Namespace,
                       rng: random.Random) -> ScenarioResult:
    import httpx

    result = ScenarioResult(
        "Web SIGKILL while clients hold websockets and post messages",
        f"{args.ws_clients} clients each hold a session's websocket "
        f"(`/ws/sessions/<id>/events/`) and post {args.ws_messages} messages, 0.2 to 1 s "
        f"apart, while uvicorn is SIGKILLed {args.web_kills} times and started again on the "
        "same port. A client resumes with `?after=<last token>` after every drop. A message "
        "is accepted when its POST answered 201 or 202; a refused connection (no web process "
        "listening yet) is retried, and a POST whose connection dropped after it was sent is "
        "counted apart (the client cannot know whether it was taken). At the end each "
        "client's events are compared with the session's whole Stream read again on a new "
        "websocket.")
    headers = platform.stack.personas["owner"].bearer()
    clients = [WebClient(number) for number in range(args.ws_clients)]
    for client in clients:
        created = await owner.post_until_accepted("/api/v1/sessions/", {"agent": "demo"})
        client.session_id = str(created["id"])
    stop_follow = asyncio.Event()
    followers = [asyncio.create_task(_relay_follow(platform, client, headers, stop_follow))
                 for client in clients]

    async def post_all(client: WebClient) -> None:
        for number in range(args.ws_messages):
            text = f"web c{client.number} m{number}"
            deadline = time.monotonic() + args.turn_timeout
            while True:
                try:
                    status, _ = await owner.post(
                        f"/api/v1/sessions/{client.session_id}/messages/", {"text": text})
                except httpx.ConnectError:
                    # Nothing was sent (no web process listens yet): sending again is safe.
                    client.refused_connections += 1
                    if time.monotonic() < deadline:
                        await asyncio.sleep(0.3)
                        continue
                    client.unanswered.append(text)
                except httpx.TransportError:
                    client.unanswered.append(text)
                else:
                    (client.accepted if status in (201, 202) else client.refused).append(text)
                break
            await asyncio.sleep(rng.uniform(0.2, 1.0))

    posters = asyncio.gather(*(post_all(client) for client in clients))
    restart_seconds: list[float] = []
    for kill in range(args.web_kills):
        await asyncio.sleep(rng.uniform(0.5, 2.0))
        restart_seconds.append(await asyncio.to_thread(platform.web_kill_restart))
        print(f"  web SIGKILL {kill + 1}/{args.web_kills}", flush=True)
    await posters

    lost = 0
    unanswered_kept = 0
    for client in clients:
        async def answered(client: WebClient = client) -> bool:
            snapshot = await owner.get(f"/api/v1/sessions/{client.session_id}/")
            present = set(user_texts(await owner.messages(client.session_id)))
            return (snapshot.get("status") == "waiting_for_user_message"
                    and not snapshot.get("queued_messages")
                    and set(client.accepted) <= present)

        await poll(answered, args.turn_timeout, interval=1.0)
        present_texts = set(user_texts(await owner.messages(client.session_id)))
        missing = [text for text in client.accepted if text not in present_texts]
        lost += len(missing)
        unanswered_kept += sum(1 for text in client.unanswered if text in present_texts)
        if missing:
            result.notes.append(f"session {client.session_id}: accepted but missing: {missing}")

    gaps = repeats = incomplete = 0
    for client in clients:
        whole = await _stream_all(platform, client.session_id, headers,
                                  client.tokens[-1] if client.tokens else None)

        async def caught_up(client: WebClient = client, last: str = whole[-1] if whole
                            else "") -> bool:
            return not last or last in client.tokens

        incomplete += not await poll(caught_up, 30)
        seen = client.tokens
        repeats += len(seen) - len(set(seen))
        start = whole.index(seen[0]) if seen and seen[0] in whole else 0
        expected = whole[start:whole.index(seen[-1]) + 1] if seen and seen[-1] in whole else whole
        missing_events = [token for token in expected if token not in set(seen)]
        gaps += len(missing_events)
        if missing_events:
            result.notes.append(f"session {client.session_id}: {len(missing_events)} events "
                                "never reached the client")
    stop_follow.set()
    await asyncio.gather(*followers)

    accepted = sum(len(client.accepted) for client in clients)
    unanswered = sum(len(client.unanswered) for client in clients)
    result.count("web SIGKILLs and restarts", args.web_kills)
    result.count("messages posted", args.ws_clients * args.ws_messages)
    result.count("accepted (201 / 202)", accepted)
    result.count("accepted messages lost", lost, 0)
    result.count("connections refused while the web restarted (POST sent again)",
                 sum(client.refused_connections for client in clients))
    result.count("POSTs whose connection dropped before an answer", unanswered)
    result.count("of those, stored anyway", unanswered_kept)
    result.count("POSTs refused with an answer (503 etc.)",
                 sum(len(client.refused) for client in clients))
    result.count("websocket reconnects", sum(client.reconnects for client in clients))
    result.count("events missing from a client's stream (gap)", gaps, 0)
    result.count("events a client received twice", repeats, 0)
    result.count("`snapshot_required` frames", sum(c.snapshot_required for c in clients), 0)
    result.count("clients that did not catch up with the Stream's end", incomplete, 0)
    if restart_seconds:
        result.rows.append(_seconds_row("web restart until it serves, max", max(restart_seconds)))
    return result


# --- scenario 4: MCP stdio ---------------------------------------------------------------


async def scenario_mcp(platform: Platform, owner: Api, args: argparse.Namespace,
                       mark: str) -> ScenarioResult:
    from mcp_registry.client import McpServerSpec, McpTransportError, list_tools

    result = ScenarioResult(
        "MCP stdio: connect/close cycles, a silent server, a killed worker",
        f"{args.mcp_cycles} connect/close cycles of the worker's MCP client "
        "(`mcp_registry.client.list_tools`: spawn the demo search server behind its guard "
        "process, `initialize`, `tools/list`, close) in this process, with its open file "
        "descriptors counted (`/proc/self/fd`) after a warm-up cycle and at the end; then a "
        f"server that never answers `initialize`, with a {args.init_timeout:g} s startup "
        "timeout; then a Dex worker that runs the demo servers for a session is SIGKILLed, "
        f"and its MCP server processes must all end within {args.orphan_grace:g} s (each "
        "server's guard stops the group once the worker is gone).")
    spec = McpServerSpec(name="search", transport="stdio", command=sys.executable,
                         args=("-m", "mcp_registry.demo_servers.search"), cwd=str(REPO),
                         env={RUN_MARK_ENV: mark}, startup_timeout=60.0)
    await list_tools(spec)
    fds_before = fd_count(os.getpid())
    fds_max = fds_before
    failures = 0
    for cycle in range(args.mcp_cycles):
        try:
            tools = await list_tools(spec)
            assert [tool.name for tool in tools] == ["web_search"], tools
        except Exception as error:
            failures += 1
            result.notes.append(f"cycle {cycle}: {type(error).__name__}: {error}"[:300])
        fds_max = max(fds_max, fd_count(os.getpid()))
    fds_after = fd_count(os.getpid())

    async def none_left() -> bool:
        return not processes_marked(mark)

    await poll(none_left, args.orphan_grace)
    left = processes_marked(mark)
    result.count("connect/close cycles", args.mcp_cycles)
    result.count("cycles that failed", failures, 0)
    result.rows.append(_fds_row(fds_before, fds_after, fds_max))
    result.count(f"server processes left after the cycles ({args.orphan_grace:g} s grace)",
                 len(left), 0)

    silent = McpServerSpec(name="silent", transport="stdio", command=sys.executable,
                           args=("-c", "import time; time.sleep(3600)"),
                           env={RUN_MARK_ENV: mark}, startup_timeout=args.init_timeout)
    started = time.monotonic()
    outcome = "answered (unexpected)"
    try:
        await list_tools(silent)
    except McpTransportError as error:
        outcome = f"McpTransportError: {error}"
    abandoned_after = time.monotonic() - started
    await poll(none_left, args.orphan_grace)
    silent_left = processes_marked(mark)
    result.rows.append(Row("silent server abandoned after", f"{abandoned_after:.1f} s",
                           f"{args.init_timeout:g} s + ≤ 5 s",
                           outcome.startswith("McpTransportError")
                           and abandoned_after <= args.init_timeout + 5))
    result.count("silent server processes left", len(silent_left), 0)
    result.notes.append(f"The silent server's error: {outcome[:200]}")

    # A worker that runs the demo servers for a session, then SIGKILLed.
    search = json.dumps({"query": "orphans"})
    docs = json.dumps({"query": "chaos"})
    text = (f"/tool search__web_search {search}\n/tool slack__search_messages "
            f"{json.dumps({'query': 'deploy'})}\n/tool docs__search_documents {docs}")
    created = await owner.post_until_accepted("/api/v1/sessions/",
                                              {"agent": "demo", "message": text})
    await turn_wait(owner, str(created["id"]), text, args.turn_timeout)
    victim = max(platform.workers_ready(),
                 key=lambda proc: len(process_descendants(proc.popen.pid)))
    kill = platform.worker_kill(victim)
    platform.worker_start()
    orphans = await _orphans_after([kill], args.orphan_grace)
    result.count("processes the killed worker had started (MCP servers and guards)",
                 len(kill.tree))
    result.count("of those still running after the SIGKILL "
                 f"({args.orphan_grace:g} s grace)", len(orphans), 0)
    result.notes += [f"orphan: pid {process.pid} `{process.command}`" for process in orphans]
    return result


def _fds_row(before: int, after: int, most: int) -> Row:
    return Row("file descriptors of the client process: after warm-up → end (max)",
               f"{before} → {after} ({most})", "flat", after <= before)


# --- the run -----------------------------------------------------------------------------


async def run_scenarios(platform: Platform, args: argparse.Namespace,
                        report: ChaosReport) -> None:
    base = platform.stack.base_url()
    owner = Api(base, platform.stack.personas["owner"].bearer())
    staff = Api(base, platform.stack.personas["staff"].bearer())
    rng = random.Random(args.seed)
    mark = uuid.uuid4().hex
    try:
        for name in args.scenarios:
            print(f"scenario {name} ...", flush=True)
            started = time.monotonic()
            try:
                if name == "worker":
                    result = await scenario_worker(platform, owner, staff, args, rng)
                elif name == "engine":
                    result = await scenario_engine(platform, owner, args, rng)
                elif name == "web":
                    result = await scenario_web(platform, owner, args, rng)
                else:
                    result = await scenario_mcp(platform, owner, args, mark)
            except Exception as error:
                # A scenario that breaks is a finding too: the report says where it stopped.
                traceback.print_exc()
                result = ScenarioResult(f"Scenario `{name}`", "Stopped by an error.")
                result.rows.append(Row("ran to the end", "no", "yes", False))
                result.notes.append(f"{type(error).__name__}: {error}"[:500])
            result.seconds = time.monotonic() - started
            report.scenarios.append(result)
            for row in result.rows:
                flag = {True: "ok", False: "MISSED", None: ""}[row.met]
                print(f"  {row.measure}: {row.value} {flag}", flush=True)
    finally:
        await owner.aclose()
        await staff.aclose()


#: Where the report of a run with the issue's full figures goes; other runs go to ``var/``.
PUBLISHED_REPORT = REPO / "docs" / "reliability.md"


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos", description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true",
                        help="a small run of every scenario (a few minutes)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated, in order; default {','.join(SCENARIOS)}")
    parser.add_argument("--sessions", type=positive_int, default=50)
    parser.add_argument("--kills", type=positive_int, default=100, help="Dex worker SIGKILLs")
    parser.add_argument("--workers", type=positive_int, default=2)
    parser.add_argument("--worker-slots", type=positive_int, default=32)
    parser.add_argument("--kill-gap", type=positive_float, nargs=2, default=(0.5, 3.0),
                        metavar=("MIN", "MAX"),
                        help="seconds from a replacement worker's ready line to the next kill")
    parser.add_argument("--engine-kills", type=positive_int, default=20)
    parser.add_argument("--engine-sessions", type=positive_int, default=5)
    parser.add_argument("--web-kills", type=positive_int, default=5)
    parser.add_argument("--ws-clients", type=positive_int, default=10)
    parser.add_argument("--ws-messages", type=positive_int, default=10)
    parser.add_argument("--mcp-cycles", type=positive_int, default=100)
    parser.add_argument("--init-timeout", type=positive_float, default=3.0,
                        help="startup timeout of the server that never answers initialize")
    parser.add_argument("--orphan-grace", type=positive_float, default=15.0)
    parser.add_argument("--slow", type=positive_float, default=0.2,
                        help="seconds between the demo model's streamed chunks")
    parser.add_argument("--turn-timeout", type=positive_float, default=600.0)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument(
        "--output", type=Path, default=None,
        help="where to write the report; default docs/reliability.md for a run with every"
             " scenario at the full figures, else var/reliability-<UTC time>.md",
    )
    if parser.parse_known_args(argv)[0].quick:
        # Smaller defaults; a figure given on the command line still wins.
        parser.set_defaults(sessions=6, kills=8, engine_kills=3, web_kills=2, ws_clients=4,
                            ws_messages=4, mcp_cycles=20)
    args = parser.parse_args(argv)
    args.scenarios = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    if not args.scenarios:
        parser.error("--scenarios names no scenario")
    if args.kill_gap[0] > args.kill_gap[1]:
        parser.error("--kill-gap MIN must not be more than MAX")
    if args.output is None:
        # Only a run at the figures replaces the published report.
        defaults = vars(parser.parse_args([]))
        full = not args.quick and args.scenarios == list(SCENARIOS) and all(
            getattr(args, name) == value
            for name, value in defaults.items()
            if name not in ("quick", "scenarios", "output", "seed")
        )
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        args.output = PUBLISHED_REPORT if full else REPO / "var" / f"reliability-{stamp}.md"
    return args


def configuration(args: argparse.Namespace) -> dict[str, str]:
    return {
        "Dex workers": f"{args.workers} x {args.worker_slots} slots",
        "sessions": str(args.sessions), "worker SIGKILLs": str(args.kills),
        "engine SIGKILLs": str(args.engine_kills), "web SIGKILLs": str(args.web_kills),
        "websocket clients": f"{args.ws_clients} x {args.ws_messages} messages",
        "MCP cycles": str(args.mcp_cycles), "seed": str(args.seed),
        "scenarios": ",".join(args.scenarios),
    }


def _interrupt(signum: int, frame: Any) -> None:
    # Once: a second signal must not cut short the stopping of the stack's processes.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    # SIGTERM (a supervisor, `timeout`, CI) stops the run as Ctrl-C does: the stack's processes
    # are stopped on the way out instead of being left running, and a second signal is ignored.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    flags = sys.argv[1:] if argv is None else argv
    command = "make chaos" if not flags else "python -m bench.chaos " + " ".join(flags)
    report = ChaosReport(started_at=datetime.now(UTC), machine=Machine.this(),
                         command=command, configuration=configuration(args))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dexagents-chaos-") as root:
        from bench._django import django_setup

        django_setup(Path(root))
        from tests.e2e.relay_stack import running_stack

        print("starting engine, demo model, web, Celery and Dex workers ...", flush=True)
        with running_stack(Path(root) / "stack", extra_env={"LOG_LEVEL": "WARNING"},
                           worker_slots=args.worker_slots) as stack:
            platform = Platform(stack, workers=args.workers, worker_slots=args.worker_slots)
            asyncio.run(run_scenarios(platform, args, report))
    report.total_seconds = time.monotonic() - started
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report_render(report))
    print(f"wrote {args.output} ({report.total_seconds / 60:.1f} min)")
    met = bool(report.scenarios) and all(scenario.goals_met for scenario in report.scenarios)
    return 0 if met else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as stopped:
        print(f"stopped ({stopped or 'Ctrl-C'}); the platform's processes were stopped too",
              file=sys.stderr)
        sys.exit(130)
