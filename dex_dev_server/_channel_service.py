"""FlowService channels: external publish, read and delete (spec section 3.2)."""

from __future__ import annotations

from typing import Any

from dex.dexpb import dex_pb2 as pb
from google.protobuf import empty_pb2

from ._errors import channel_message_not_found, invalid
from ._runs import RunEngine, check_value


class ChannelService(RunEngine):
    """FlowService handlers for a run's channels."""

    # Channels -----------------------------------------------------------------------------------

    async def PublishToChannel(
        self, request: pb.PublishToChannelRequest, context: Any
    ) -> empty_pb2.Empty:
        for message in request.messages:
            if not message.channel_name:
                raise invalid("channel_name is required")
            check_value(message.value, "message value")
        run = self._open_run(request.flow_id, request.run_id)
        if not request.messages:
            return empty_pb2.Empty()
        published = [self.publish(run, m.channel_name, m.value) for m in request.messages]
        self.add_history(
            run, channel_external_publish=pb.ChannelExternalPublishEvent(messages=published)
        )
        self.settle(run)
        return empty_pb2.Empty()

    async def GetChannelMessages(
        self, request: pb.GetChannelMessagesRequest, context: Any
    ) -> pb.GetChannelMessagesResponse:
        if not request.channel_name:
            raise invalid("channel_name is required")
        run = self._existing_run(request.flow_id, request.run_id)
        entries = run.channels.get(request.channel_name, [])
        return pb.GetChannelMessagesResponse(messages=[e.message for e in entries])

    async def DeleteChannelMessage(
        self, request: pb.DeleteChannelMessageRequest, context: Any
    ) -> empty_pb2.Empty:
        if not request.channel_name or not request.message_id:
            raise invalid("channel_name and message_id are required")
        run = self._open_run(request.flow_id, request.run_id)
        if not self.delete_message(run, request.channel_name, request.message_id):
            raise channel_message_not_found(
                f"message {request.message_id!r} is not pending on {request.channel_name!r}"
            )
        self.add_history(
            run,
            channel_external_delete=pb.ChannelExternalDeleteEvent(
                messages=[
                    pb.ChannelMessageDeletion(
                        channel_name=request.channel_name, message_id=request.message_id
                    )
                ]
            ),
        )
        self.settle(run)
        return empty_pb2.Empty()
