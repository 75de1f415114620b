"""FlowService Streams: write, long-poll read and list (spec section 3.3)."""

from __future__ import annotations

from typing import Any

from dex.dexpb import dex_pb2 as pb
from google.protobuf import empty_pb2

from . import _streams
from ._clock import now
from ._errors import invalid, long_poll_timeout
from ._model import has_kind, null_value
from ._runs import MAX_LONG_POLL, RunEngine, check_value, long_poll_budget


class StreamService(RunEngine):
    """FlowService handlers for Dex Streams."""

    # Streams ------------------------------------------------------------------------------------

    async def WriteStream(self, request: pb.WriteStreamRequest, context: Any) -> empty_pb2.Empty:
        if not request.flow_id or not request.flow_type or not request.stream_name:
            raise invalid("flow_id, flow_type and stream_name are required")
        if not request.source:
            raise invalid("source is required")
        if request.stream_capacity_bytes < 0:
            raise invalid("stream_capacity_bytes must not be negative")
        check_value(request.value, "value")
        value = request.value if has_kind(request.value) else null_value()
        _streams.append(
            self,
            request.flow_type,
            request.stream_name,
            request.flow_id,
            value,
            request.source,
            request.stream_capacity_bytes,
        )
        return empty_pb2.Empty()

    async def ReadStream(
        self, request: pb.ReadStreamRequest, context: Any
    ) -> pb.ReadStreamResponse:
        if not request.flow_id or not request.flow_type or not request.stream_name:
            raise invalid("flow_id, flow_type and stream_name are required")
        if request.wait_time_seconds < 0:
            raise invalid("wait_time_seconds must not be negative")
        after = 0
        if request.resume_token:
            after = _streams.parse_token(
                request.resume_token, request.flow_type, request.stream_name, request.flow_id
            )
        cap = min(float(request.wait_time_seconds or MAX_LONG_POLL), MAX_LONG_POLL)
        deadline = now() + long_poll_budget(context, cap)
        key = ("stream", request.flow_type, request.stream_name, request.flow_id)
        while True:
            message = _streams.read_after(
                self, request.flow_type, request.stream_name, request.flow_id, after
            )
            if message is not None:
                return pb.ReadStreamResponse(message=message)
            left = deadline - now()
            if left <= 0:
                raise long_poll_timeout("no stream message arrived in time")
            await self.notifier.wait(key, left)

    async def ListStreamMessages(
        self, request: pb.ListStreamMessagesRequest, context: Any
    ) -> pb.ListStreamMessagesResponse:
        if not request.flow_id or not request.flow_type or not request.stream_name:
            raise invalid("flow_id, flow_type and stream_name are required")
        if request.page_size <= 0:
            raise invalid("page_size must be positive")
        size = min(request.page_size, 1000)
        before = 0
        if request.before_page_token:
            before = _streams.parse_token(
                request.before_page_token, request.flow_type, request.stream_name, request.flow_id
            )
        messages = _streams.list_before(
            self, request.flow_type, request.stream_name, request.flow_id, before, size + 1
        )
        resp = pb.ListStreamMessagesResponse(messages=messages[:size])
        if len(messages) > size:
            resp.next_page_token = messages[size - 1].resume_token
        return resp
