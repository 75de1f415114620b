"""What a failed model call raises: which provider failures another attempt may fix (issue 25).

RunModel retries a failed attempt (seed "run_model_step": 3 attempts within 30 minutes), so a
request the provider refused itself must not be sent again, a rate limit with ``Retry-After``
waits that long, and a context-window error lets the session compact.
:func:`provider_failure` sorts LiteLLM's exceptions so; the runner's model calls, its
summarizer and the title generator (``agents_app.worker.titles``) raise what it returns. The
API key never shows in what it returns.

May import: ``agents_app.providers`` (LiteLLM, lazily) and ``dex_agents``.
"""

from __future__ import annotations

import re

from agents_app.providers import load_litellm
from dex_agents import ContextWindowExceededError, ModelCallError, ModelRateLimitError

__all__ = [
    "REFUSAL_MAX_CHARS",
    "REFUSAL_STATUSES",
    "RETRY_AFTER_MAX_SECONDS",
    "ProviderCallError",
    "RedactedProviderError",
    "provider_failure",
]

_litellm = load_litellm
"""Import LiteLLM lazily (see ``agents_app.providers.load_litellm``)."""


class ProviderCallError(RuntimeError):
    """A model provider's failure that another attempt may fix (a timeout, a connection error,
    HTTP 429 without ``Retry-After``, 5xx), in a sentence with the provider's own words and
    the key redacted (``provider_failure``). Fails the attempt (retried); after the last one
    it is the turn's ``last_turn_error``."""


class RedactedProviderError(RuntimeError):
    """A provider error whose text contained the API key; the key is replaced by
    ``[redacted]`` and the original exception is not chained. Fails the attempt (retried)."""


#: Longest ``Retry-After`` a rate-limited model call waits for before its next attempt
#: (seconds); RunModel's attempts must fit in its 30 minutes.
RETRY_AFTER_MAX_SECONDS = 600
#: How much of a provider's refusal ``last_turn_error`` keeps (characters).
REFUSAL_MAX_CHARS = 1000
#: HTTP statuses of a request the provider refused itself: the same request would be refused
#: again (invalid, key not accepted, payment required, no access, no such model, unprocessable).
REFUSAL_STATUSES = frozenset({400, 401, 402, 403, 404, 422})
_LITELLM_PREFIX = re.compile(r"^(?:litellm\.\w+:\s*)?(?:\w+Error:\s*)?(?:\w+Exception\s*-\s*)?")


def provider_failure(
    error: Exception, api_key: str | None, *, refusals: bool = True
) -> BaseException:
    """What a model call that raised ``error`` raises in turn (issue 25: retry only what a
    retry can fix).

    - a context-window error: ``ContextWindowExceededError`` (the session compacts);
    - with ``refusals``, a request the provider refused itself (LiteLLM's ``BadRequestError``
      family, ``AuthenticationError``, ``PermissionDeniedError``, ``NotFoundError``,
      ``UnprocessableEntityError``, or LiteLLM's ``APIError`` with one of
      :data:`REFUSAL_STATUSES`):
      ``dex_agents.ModelCallError`` with the provider's message, so RunModel fails the turn
      at once instead of sending the same request twice more;
    - HTTP 429 with a ``Retry-After`` in seconds: ``dex_agents.ModelRateLimitError`` (the next
      attempt waits that long, at most :data:`RETRY_AFTER_MAX_SECONDS`);
    - LiteLLM's other provider errors (timeouts, connection errors, 429 without
      ``Retry-After``, 5xx): :class:`ProviderCallError` with the provider's words; the attempt
      fails and is retried;
    - anything else: ``error`` itself, or its :class:`RedactedProviderError` when its text
      holds the key.

    The key never shows in what this returns.
    """
    litellm = _litellm()
    shown: Exception = _redact(error, api_key) or error
    # LiteLLM prefixes its class names ("litellm.BadRequestError: BadRequestError:
    # OpenAIException - "); the provider's own words follow, and they are what a user reads.
    text = _LITELLM_PREFIX.sub("", str(shown)) or str(shown)
    if len(text) > REFUSAL_MAX_CHARS:
        text = text[: REFUSAL_MAX_CHARS - 1] + "…"
    if isinstance(error, litellm.ContextWindowExceededError):
        return ContextWindowExceededError(
            f"The model provider refused the input as too long: {text}"
        )
    refused = (
        litellm.BadRequestError,
        litellm.AuthenticationError,
        litellm.PermissionDeniedError,
        litellm.NotFoundError,
        litellm.UnprocessableEntityError,
    )
    status = getattr(error, "status_code", None)
    # LiteLLM maps some refusals to its generic APIError (an OpenAI-compatible 403 is one);
    # their status tells.
    if refusals and (isinstance(error, refused) or (
        isinstance(error, litellm.APIError) and status in REFUSAL_STATUSES
    )):
        return ModelCallError(f"The model provider refused the request (HTTP {status}): {text}")
    if isinstance(error, litellm.RateLimitError):
        seconds = _retry_after_seconds(error)
        if seconds is not None:
            return ModelRateLimitError(
                f"The model provider asked to wait {seconds} s (HTTP 429): {text}", seconds
            )
    import openai  # LiteLLM's provider errors all derive from the OpenAI SDK's APIError

    if not isinstance(error, openai.APIError):
        return shown
    if isinstance(error, litellm.Timeout):
        return ProviderCallError(f"The model provider did not answer in time: {text}")
    if isinstance(error, litellm.APIConnectionError):
        return ProviderCallError(f"The model provider could not be reached: {text}")
    where = f" (HTTP {status})" if isinstance(status, int) else ""
    return ProviderCallError(f"The model provider failed{where}: {text}")


def _retry_after_seconds(error: Exception) -> int | None:
    """The whole seconds of a rate-limit error's ``Retry-After`` header (1 to
    :data:`RETRY_AFTER_MAX_SECONDS`), or None without one in seconds."""
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None) or getattr(error, "headers", None) or {}
    try:
        value = headers.get("retry-after")
    except AttributeError:
        return None
    try:
        seconds = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    if seconds != seconds or seconds <= 0:  # NaN or none
        return None
    return max(1, min(RETRY_AFTER_MAX_SECONDS, int(-(-seconds // 1))))


def _redact(error: Exception, secret: str | None) -> Exception | None:
    """A :class:`RedactedProviderError` when ``secret`` shows in the error's text, else
    ``None``."""
    if not secret or len(secret) < 4:
        return None
    text = f"{type(error).__name__}: {error}"
    if secret not in text and secret not in repr(error):
        return None
    return RedactedProviderError(text.replace(secret, "[redacted]"))
