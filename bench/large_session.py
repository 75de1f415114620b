"""One agent session grown to ``--messages`` messages of real turns, on the platform's processes.

The proof of issue 26 at scale, through the whole platform (``tests/e2e/relay_stack.py``: the
embedded engine, the demo model, ``manage.py dexworker`` and one uvicorn): a stdio MCP server
(``tests/mcp_registry/stub_server.py``) answers each call with ``--result-chars`` characters
(one- and two-byte), and every turn asks for ``--calls`` of them in parallel, so a turn stores
``--calls`` + 3 messages (the user's, the tool request, the results, the answer). The demo
agent keeps every message (``message_retention_limit`` past the count), sees 200 characters of
each result, and compacts its context when it passes 85 % of a 100,000-token window. Unlike
``bench/long_session.py``, which stores messages through a bench-only RPC to time the engine's
snapshot read, every message here is a turn's.

At every tenth of the way it prints the message count, the stored text so far, the web API's
snapshot and page read times (p50 of ``--reads``) and the resident memory of the engine, the
worker and the web process. At the end it checks, on the grown session: a tool result read whole
through ``GET .../messages/<n>/text/``, a write approved by staff, a message steered ahead of
another, and that compaction ran (the summary).

Run: ``.venv/bin/python -m bench.large_session`` (20,000 messages, about 200 MB: tens of
minutes) or ``--quick`` (2,000 messages, about 20 MB), or ``make bench-large-session``.
Prints figures; it fails only when the session does (a turn error, a failed read).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._django import django_setup

#: What the stub pads each answer with, repeated (one- and two-byte characters).
PAD_TEXT = "lorem ipsum café "
#: The demo agent for the bench: a large window, every message kept, short results shown.
AGENT_CODE = """
import json
from agents_app.models import AgentDefinition
from mcp_registry.models import McpTool
agent = AgentDefinition.objects.get(slug="demo")
agent.tools.add(*McpTool.objects.filter(exposed_name="bulky__echo", available=True))
agent.context_window = 100_000
agent.message_retention_limit = {retention}
agent.tool_result_max_chars = 200
agent.save()
print(json.dumps(sorted(agent.tools.values_list("exposed_name", flat=True))))
"""


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _timed(call: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    answer = call()
    return (time.perf_counter() - started) * 1000, answer


def _wait_idle(api: Any, session: str, timeout: float) -> dict[str, Any]:
    """The snapshot once the session waits for a message again with no turn error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = api.get(f"/api/v1/sessions/{session}/")
        if answer.status_code == 200:
            body: dict[str, Any] = answer.json()
            if body.get("last_turn_error"):
                raise RuntimeError(f"the turn failed: {body['last_turn_error']}")
            if (body["status"] == "waiting_for_user_message" and not body["queued_messages"]
                    and not body["steered_messages"]):
                return body
        time.sleep(0.2)
    raise TimeoutError(f"session {session} did not finish its turn in {timeout} s")


def _message_count(snapshot: dict[str, Any]) -> int:
    return max((item["sequence"] for item in snapshot["messages"]), default=0)


def run(args: argparse.Namespace, root: Path) -> None:
    from tests.e2e.conftest import PYTHON
    from tests.e2e.relay_stack import running_stack
    from tests.mcp_registry.stub_server import padded_echo_yaml

    with running_stack(root) as stack:
        config = root / "servers.yaml"
        config.write_text(padded_echo_yaml("bulky", args.result_chars, PAD_TEXT))
        stack.processes.run([PYTHON, "manage.py", "mcp_import", "--no-discover", str(config)])
        stack.processes.run([PYTHON, "manage.py", "mcp_discover", "bulky"])
        tools = stack.django_shell(AGENT_CODE.format(retention=args.messages + 1000))
        assert "bulky__echo" in tools, tools
        worker = next(proc for proc in stack.processes.started if proc.name == "worker")
        pids = {"engine": stack.engine.popen.pid, "worker": worker.popen.pid,
                "web": stack.web.popen.pid}
        owner, staff = stack.api("owner"), stack.api("staff")

        def turn_text(turn: int) -> str:
            return "\n".join(
                f"/tool bulky__echo {json.dumps({'text': f'{turn}.{call}'})}"
                for call in range(args.calls)
            )

        created = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": turn_text(1)})
        if created.status_code != 201:
            raise RuntimeError(created.text)
        session = created.json()["id"]
        print(f"{args.calls} calls of {args.result_chars:,} characters a turn, "
              f"{args.calls + 3} messages a turn; session {session}", flush=True)
        print(f"{'messages':>9} {'results MB':>8} {'turn s':>7} {'snapshot ms':>12} "
              f"{'page ms':>8} {'engine MiB':>11} {'worker MiB':>11} {'web MiB':>8}", flush=True)
        results_text = args.calls * args.result_chars  # characters of results a turn
        turn, started = 1, time.monotonic()
        next_report = args.messages / 10
        turn_seconds: list[float] = []
        while True:
            snapshot = _wait_idle(owner, session, timeout=600)
            turn_seconds.append(time.monotonic() - started)
            count = _message_count(snapshot)
            if count >= next_report or count >= args.messages:
                reads = [_timed(lambda: owner.get(f"/api/v1/sessions/{session}/"))
                         for _ in range(args.reads)]
                pages = [_timed(lambda: owner.get(f"/api/v1/sessions/{session}/messages/",
                                                  params={"limit": 50}))
                         for _ in range(args.reads)]
                assert all(answer.status_code == 200 for _, answer in reads + pages)
                print(f"{count:>9,} {turn * results_text / 1e6:>8.1f} "
                      f"{statistics.median(turn_seconds[-10:]):>7.2f} "
                      f"{statistics.median(ms for ms, _ in reads):>12.1f} "
                      f"{statistics.median(ms for ms, _ in pages):>8.1f} "
                      f"{rss_mib(pids['engine']):>11.0f} {rss_mib(pids['worker']):>11.0f} "
                      f"{rss_mib(pids['web']):>8.0f}", flush=True)
                next_report += args.messages / 10
            if count >= args.messages:
                break
            turn += 1
            started = time.monotonic()
            sent = owner.post(f"/api/v1/sessions/{session}/messages/",
                              json={"text": turn_text(turn)})
            if sent.status_code != 202:
                raise RuntimeError(sent.text)

        # On the grown session: a result read whole, compaction, an approval and Steer.
        page = owner.get(f"/api/v1/sessions/{session}/messages/", params={"limit": 50}).json()
        result = next(item for item in page["messages"] if item["role"] == "tool")
        url = f"/api/v1/sessions/{session}/messages/{result['sequence']}/text/"
        whole = owner.get(url).json()
        assert whole["text"].startswith(result["text"][:100]), whole
        print(f"a tool result read whole: {whole['text_length']:,} characters in "
              f"{whole['parts']} part(s)", flush=True)
        summary = owner.get(f"/api/v1/sessions/{session}/").json().get("summary")
        print(f"compaction: summary through message "
              f"{summary['through_sequence'] if summary else None}", flush=True)
        write = "/tool slack__post_message " + json.dumps({"channel": "general", "text": "hi"})
        assert owner.post(f"/api/v1/sessions/{session}/messages/",
                          json={"text": write}).status_code == 202
        deadline = time.monotonic() + 120
        while not (held := stack.held_approvals(session)):
            if time.monotonic() > deadline:
                raise TimeoutError("the write did not wait for approval")
            time.sleep(0.2)
        first = owner.post(f"/api/v1/sessions/{session}/messages/", json={"text": "first"})
        second = owner.post(f"/api/v1/sessions/{session}/messages/", json={"text": "second"})
        assert first.status_code == second.status_code == 202
        decided = staff.post(f"/api/v1/sessions/{session}/interrupts/"
                             f"{held[0]['interrupt_id']}/", json={"approved": True})
        assert decided.status_code == 200, decided.text
        # Steered while the approved call and its model call run (steering a turn that waits
        # for approval withdraws the approval instead).
        steered = owner.post(f"/api/v1/sessions/{session}/queue/{second.json()['id']}/steer/")
        assert steered.status_code == 202, steered.text
        final = _wait_idle(owner, session, timeout=300)
        said = [item["text"] for item in final["messages"] if item["role"] == "user"]
        assert said.index("second") < said.index("first"), said
        print(f"approval decided and steered message taken first; {_message_count(final):,} "
              f"messages; RSS engine {rss_mib(pids['engine']):.0f} MiB, worker "
              f"{rss_mib(pids['worker']):.0f} MiB, web {rss_mib(pids['web']):.0f} MiB",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--calls", type=int, default=100, help="parallel tool calls a turn")
    parser.add_argument("--result-chars", type=int, default=10_000,
                        help="characters of each tool result")
    parser.add_argument("--reads", type=int, default=5, help="timed reads per report")
    parser.add_argument("--quick", action="store_true", help="2,000 messages")
    args = parser.parse_args()
    if args.quick:
        args.messages = 2_000
    with tempfile.TemporaryDirectory(prefix="bench-large-session-") as root:
        django_setup(Path(root))
        run(args, Path(root))


if __name__ == "__main__":
    main()
