"""A small SearchFlows query evaluator (spec section 4.7)."""

from __future__ import annotations

import re
from typing import Any

from dex.dexpb import dex_pb2 as pb

from ._blobs import BLOB_KINDS
from ._clock import timestamp
from ._errors import invalid
from ._model import Run
from ._state import EngineState

_STATUS = {
    "running": pb.FLOW_STATUS_RUNNING,
    "completed": pb.FLOW_STATUS_COMPLETED,
    "failed": pb.FLOW_STATUS_FAILED,
    "canceled": pb.FLOW_STATUS_CANCELED,
    "terminated": pb.FLOW_STATUS_TERMINATED,
    "continuedasnew": pb.FLOW_STATUS_CONTINUED_AS_NEW,
}
_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^'\\]|\\.)*')|(?P<num>-?\d+(?:\.\d+)?)|(?P<op>!=|>=|<=|=|>|<)"
    r"|(?P<par>[()])|(?P<word>[A-Za-z_][\w.-]*))"
)


def _tokens(query: str) -> list[tuple[str, str]]:
    out = []
    pos = 0
    query = query.strip()
    while pos < len(query):
        m = _TOKEN.match(query, pos)
        if m is None or m.end() == pos:
            raise invalid(f"cannot parse query near {query[pos:pos + 20]!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _field(run: Run, name: str) -> Any:
    low = name.lower()
    if low == "flowtype":
        return run.flow_type
    if low in ("flowid", "workflowid"):
        return run.flow_id
    if low == "executionstatus":
        return run.status
    if low == "starttime":
        return run.start_ts
    if low == "closetime":
        return run.close_ts
    if low == "activesteptypes":
        return [s.step_type for s in run.steps.values()]
    value = run.search.get(name)
    if value is None:
        value = run.attributes.get(name)
    if value is None:
        return None
    kind = value.WhichOneof("kind")
    if kind in BLOB_KINDS:
        # A blob-backed value is never compared by its id (spec section 3.5).
        return None
    if kind == "obj_value":
        import json

        try:
            return json.loads(value.obj_value.payload)
        except ValueError:
            return None
    return getattr(value, kind) if kind else None


def _compare(a: Any, op: str, b: Any) -> bool:
    if a is None:
        return False
    if isinstance(a, list):
        return any(_compare(x, op, b) for x in a) if op == "=" else all(
            _compare(x, op, b) for x in a
        )
    try:
        return {
            "=": a == b,
            "!=": a != b,
            ">": a > b,
            ">=": a >= b,
            "<": a < b,
            "<=": a <= b,
        }[op]
    except TypeError:
        return False


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.t = tokens
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise invalid("unexpected end of query")
        self.i += 1
        return tok

    def expr(self) -> Any:
        left = self.conj()
        while (tok := self.peek()) and tok[0] == "word" and tok[1].lower() == "or":
            self.take()
            right = self.conj()
            left = (lambda lft, r: lambda run: lft(run) or r(run))(left, right)
        return left

    def conj(self) -> Any:
        left = self.atom()
        while (tok := self.peek()) and tok[0] == "word" and tok[1].lower() == "and":
            self.take()
            right = self.atom()
            left = (lambda lft, r: lambda run: lft(run) and r(run))(left, right)
        return left

    def atom(self) -> Any:
        kind, text = self.take()
        if kind == "par" and text == "(":
            inner = self.expr()
            if self.take() != ("par", ")"):
                raise invalid("missing ')' in query")
            return inner
        if kind != "word":
            raise invalid(f"expected a field name, got {text!r}")
        name = text
        op_kind, op = self.take()
        if op_kind != "op":
            raise invalid(f"expected an operator after {name!r}")
        vkind, vtext = self.take()
        value: Any
        if vkind == "str":
            value = vtext[1:-1].replace("\\'", "'")
        elif vkind == "num":
            value = float(vtext) if "." in vtext else int(vtext)
        elif vkind == "word" and vtext.lower() in ("true", "false"):
            value = vtext.lower() == "true"
        else:
            raise invalid(f"expected a literal, got {vtext!r}")
        if name.lower() == "executionstatus" and isinstance(value, str):
            value = _STATUS.get(value.lower().replace("_", ""), -1)
        return lambda run: _compare(_field(run, name), op, value)


def search_flows(engine: EngineState, request: pb.SearchFlowsRequest) -> pb.SearchFlowsResponse:
    """Evaluate a SearchFlows request over the latest run of every flow."""
    if request.page_size < 0:
        raise invalid("page_size must not be negative")
    size = request.page_size or 1000
    predicate: Any = bool
    if request.query.strip():
        parser = _Parser(_tokens(request.query))
        predicate = parser.expr()
        if parser.peek() is not None:
            raise invalid("unexpected trailing tokens in query")
    offset = int(request.next_page_token or 0)
    runs = [engine.runs[ids[-1]] for ids in engine.flows.values()]
    runs = [
        r for r in runs
        if predicate(r) and (request.include_continued_as_new
                             or r.status != pb.FLOW_STATUS_CONTINUED_AS_NEW)
    ]
    runs.sort(key=lambda r: r.start_ts, reverse=True)
    page = runs[offset:offset + size]

    resp = pb.SearchFlowsResponse()
    for run in page:
        entry = resp.flow_runs.add(
            flow_id=run.flow_id,
            run_id=run.run_id,
            flow_type=run.flow_type,
            flow_status=run.status,
            start_time=timestamp(run.start_ts),
        )
        if run.close_ts is not None:
            entry.close_time.CopyFrom(timestamp(run.close_ts))
        for name, value in sorted(run.search.items()):
            entry.indexed_attributes.add(key=name, value=value)
    if offset + size < len(runs):
        resp.next_page_token = str(offset + size)
    return resp
