"""The translation of Dex SDK errors (``agents_app.gateway.engine_errors``; no engine needed)."""

import grpc

from agents_app.gateway import engine_errors


def test_a_message_past_the_grpc_limit_means_the_session_is_too_large() -> None:
    class TooLarge(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.RESOURCE_EXHAUSTED

        def details(self) -> str:
            return "Received message larger than max (15285025 vs. 4194304)"

    translated = engine_errors.translate(TooLarge(), "ses_x")
    assert isinstance(translated, engine_errors.SessionTooLargeError)
