"""Model providers: which API a model uses, where its key comes from, its context window and
whether it accepts images.

Django-free and cheap to import: LiteLLM is imported lazily by :func:`load_litellm`, only when a
context window, a token count or image support is asked for (the worker does that; the web
process only calls :func:`provider_status`, which never imports LiteLLM).

Providers (issue 6, "Providers"; reference ``ai-agent-features.md`` §1 and §4):

=========================  ==================  =========================================
model prefix               default key         notes
=========================  ==================  =========================================
``openai/``                ``OPENAI_API_KEY``  Responses API unless a custom ``api_base``
``anthropic/``             ``ANTHROPIC_API_KEY``
``gemini/``                ``GEMINI_API_KEY``
``groq/``                  ``GROQ_API_KEY``
``ollama/``, ``ollama_chat/``, ``hosted_vllm/``, ``lm_studio/``    none: local servers
any prefix + ``api_base``  none                an OpenAI-compatible server (vLLM, LM Studio,
                                               Ollama, the demo model)
=========================  ==================  =========================================

An agent definition names the variable that holds its key (``api_key_env``); without one, the
provider's default variable is used, and a model served from an ``api_base`` needs no key.
Keys are read from the worker's environment at call time and never leave this process: no
function here returns a key inside a message, a status or an exception.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

ModelApi = Literal["chat", "responses"]
"""``chat``: Chat Completions through ``litellm.acompletion``; ``responses``: the OpenAI
Responses API through ``litellm.aresponses``."""

LOCAL_SERVER_KEY = "dexagents-local"
"""The placeholder key sent to an ``api_base`` server when the agent names no key variable
(OpenAI-compatible clients refuse to send a request without one; local servers ignore it)."""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PRINTABLE_ASCII = re.compile(r"^[\x21-\x7e]+$")


@dataclass(frozen=True)
class ProviderInfo:
    """One known LiteLLM provider.

    Attributes:
        prefix: The model prefix without the slash (``"openai"``).
        label: A human name.
        key_env: The environment variable LiteLLM itself reads for the key, or ``None`` for
            servers that need none.
    """

    prefix: str
    label: str
    key_env: str | None


PROVIDERS: tuple[ProviderInfo, ...] = (
    ProviderInfo("openai", "OpenAI", "OPENAI_API_KEY"),
    ProviderInfo("anthropic", "Anthropic", "ANTHROPIC_API_KEY"),
    ProviderInfo("gemini", "Google Gemini", "GEMINI_API_KEY"),
    ProviderInfo("groq", "Groq", "GROQ_API_KEY"),
    ProviderInfo("ollama", "Ollama", None),
    ProviderInfo("ollama_chat", "Ollama", None),
    ProviderInfo("hosted_vllm", "vLLM", None),
    ProviderInfo("lm_studio", "LM Studio", None),
)
_BY_PREFIX = {provider.prefix: provider for provider in PROVIDERS}


class ProviderNotConfiguredError(RuntimeError):
    """The model's provider has no usable key in this environment.

    The message names the variable, never a value. Raised by :func:`resolve_api_key`.
    """


@dataclass(frozen=True)
class ProviderStatus:
    """Whether a model can be called from this environment.

    Attributes:
        configured: ``True`` when a session using the model can start.
        reason: One sentence for people: what is used, or what to set. Never contains a key.
    """

    configured: bool
    reason: str


def model_prefix(model: str) -> str | None:
    """The provider prefix of a LiteLLM model name (``"anthropic/claude-x"`` -> ``"anthropic"``),
    or ``None`` for a bare name."""
    prefix, slash, rest = model.partition("/")
    return prefix.strip().lower() if slash and prefix.strip() and rest.strip() else None


def provider_info(model: str) -> ProviderInfo | None:
    """The known provider of ``model``, or ``None`` (bare name or another LiteLLM provider)."""
    prefix = model_prefix(model)
    return _BY_PREFIX.get(prefix) if prefix else None


def _key_problem(variable: str, environ: Mapping[str, str]) -> str | None:
    if not _ENV_NAME.match(variable):
        return f"{variable!r} is not a valid environment variable name."
    value = environ.get(variable, "")
    if not value.strip():
        return f"Set the environment variable {variable} for the worker, then restart it."
    if not _PRINTABLE_ASCII.match(value.strip()):
        return f"The environment variable {variable} holds characters that cannot be a key."
    return None


def provider_status(
    model: str,
    api_key_env: str | None,
    api_base: str | None,
    *,
    environ: Mapping[str, str] | None = None,
) -> ProviderStatus:
    """Report whether ``model`` can be called, before a session starts (issue 6, "Providers").

    Rules, in order:

    1. ``model`` must be non-blank.
    2. ``api_key_env`` given: configured when that variable is set to a printable-ASCII value.
    3. ``api_base`` given: configured (a local OpenAI-compatible server; no key needed).
    4. A known provider (table in the module docstring): configured when its default variable
       is set, or when it needs no key.
    5. Otherwise not configured: the definition must name ``api_key_env`` or an ``api_base``.

    Args:
        model: The LiteLLM model name, e.g. ``"anthropic/claude-sonnet-4-5"``.
        api_key_env: The variable that holds the key, or ``None``.
        api_base: A custom base URL, or ``None``.
        environ: The environment to read; ``os.environ`` by default.

    Returns:
        A :class:`ProviderStatus`; its ``reason`` never contains a key value. Never raises.
    """
    env = os.environ if environ is None else environ
    model = (model or "").strip()
    if not model:
        return ProviderStatus(False, "The agent definition names no model.")
    if api_key_env:
        problem = _key_problem(api_key_env, env)
        if problem:
            return ProviderStatus(False, problem)
        return ProviderStatus(True, f"Uses the key in {api_key_env}.")
    if api_base:
        return ProviderStatus(True, f"Uses the server at {api_base} without a key.")
    info = provider_info(model)
    if info is None:
        return ProviderStatus(
            False,
            f"No key variable is known for {model!r}: name one (api_key_env) or an api_base.",
        )
    if info.key_env is None:
        return ProviderStatus(True, f"{info.label} needs no key.")
    problem = _key_problem(info.key_env, env)
    if problem:
        return ProviderStatus(False, problem)
    return ProviderStatus(True, f"Uses the key in {info.key_env}.")


def resolve_api_key(
    model: str,
    api_key_env: str | None,
    api_base: str | None,
    *,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """Read the key for one model call from the environment, now.

    Returns:
        The key; :data:`LOCAL_SERVER_KEY` for an ``api_base`` without ``api_key_env``; ``None``
        for a provider that needs no key.

    Raises:
        ProviderNotConfiguredError: When :func:`provider_status` reports not configured (the
            message names the variable, never a value).
    """
    env = os.environ if environ is None else environ
    status = provider_status(model, api_key_env, api_base, environ=env)
    if not status.configured:
        raise ProviderNotConfiguredError(status.reason)
    if api_key_env:
        return env[api_key_env].strip()
    if api_base:
        return LOCAL_SERVER_KEY
    info = provider_info(model)
    if info is None or info.key_env is None:
        return None
    return env[info.key_env].strip()


def choose_api(model: str, api_base: str | None, configured: str | None) -> ModelApi:
    """Which API a call uses (agent_config key ``api``).

    ``"chat"`` or ``"responses"`` is taken as configured; ``None`` (auto) picks the Responses
    API for ``openai/`` models with no custom ``api_base``, and Chat Completions otherwise.

    Raises:
        ValueError: If ``configured`` is another value.
    """
    if configured in ("chat", "responses"):
        return configured  # type: ignore[return-value]
    if configured not in (None, ""):
        raise ValueError(f"agent_config 'api' must be 'chat', 'responses' or null: {configured!r}")
    return "responses" if model_prefix(model) == "openai" and not api_base else "chat"


@functools.cache
def load_litellm() -> Any:
    """Import LiteLLM on first use: it takes seconds, and only the worker calls models.

    LiteLLM reads two variables at import time: use its bundled model cost map instead of
    fetching one, and do not load stray ``.env`` files (which could carry real keys into tests).
    """
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_MODE", "PRODUCTION")
    module: Any = importlib.import_module("litellm")
    module.suppress_debug_info = True
    module.telemetry = False
    return module


def litellm_warm() -> None:
    """Load what a worker's first model Step would otherwise load on its event loop.

    Imports LiteLLM (seconds of CPU: ~3 s on an idle 2-core machine, far more under load),
    reads its model information once and makes its token counter load the default tokenizer
    (tiktoken's ``cl100k_base``, bundled with LiteLLM). Each happened synchronously inside the
    first RunModel Step's ``context_window`` and ``count_input_tokens`` calls (context
    compaction), so on the worker's event loop every RPC served meanwhile waited (a message
    POST right after the first session started waited 4-20 s, past the web's 5 s engine
    timeout).

    ``manage.py dexworker`` runs it in a thread before it registers with the engine
    (``agents_app.worker.model_calls.model_calls_warm``). Safe from any thread and more than
    once.
    """
    litellm = load_litellm()
    litellm.get_model_info("gpt-4o-mini")
    litellm.token_counter(model="gpt-4o-mini", messages=[{"role": "user", "content": "warm up"}])


def context_window(
    model: str, configured: int | None = None, api_base: str | None = None
) -> int | None:
    """The model's context window in tokens.

    ``configured`` (the agent definition's ``context_window``) wins; otherwise LiteLLM's model
    information (``max_input_tokens``, else ``max_tokens``). ``None`` when neither knows the
    model (for example a local server's model). A smaller window the provider named when it
    refused an input of this model at ``api_base`` with this ``configured`` value
    (:func:`remember_served_window`) wins over both. Imports LiteLLM.
    """
    window = int(configured) if configured else _model_window(model)
    served = _served_windows.get((model, api_base or "", int(configured or 0)))
    if served is not None and (window is None or served < window):
        return served
    return window


#: Windows providers named in context-window refusals, per ``(model, api_base, configured
#: window)``: a changed agent definition is a new key, so its first refusal is learned anew.
#: Per worker process, kept until it exits (issue 25).
_served_windows: dict[tuple[str, str, int], int] = {}
_SERVED_WINDOW_PATTERNS = (
    re.compile(r"maximum context length is (\d[\d,]*)", re.IGNORECASE),
    re.compile(r"context (?:length|window) (?:is|of) (\d[\d,]*)", re.IGNORECASE),
    re.compile(r"\d[\d,]* tokens? > (\d[\d,]*) maximum", re.IGNORECASE),
)


def remember_served_window(
    model: str, configured: int | None, api_base: str | None, refusal: str
) -> bool:
    """Learn the window a provider named in a context-window ``refusal`` (OpenAI's "maximum
    context length is N tokens", Anthropic's "N tokens > M maximum", "context length of N"),
    when it is smaller than what :func:`context_window` knows; returns whether it was (the
    window just became smaller). Later calls for the same model, ``api_base`` and ``configured``
    window use it, so the session compacts before the call instead of after a refusal on
    every turn (a provider serving a smaller window than the agent is configured with)."""
    for pattern in _SERVED_WINDOW_PATTERNS:
        match = pattern.search(refusal)
        if match is None:
            continue
        served = int(match.group(1).replace(",", ""))
        known = context_window(model, configured, api_base)
        if served <= 0 or (known is not None and served >= known):
            return False
        _served_windows[(model, api_base or "", int(configured or 0))] = served
        return True
    return False


@functools.lru_cache(maxsize=256)
def _model_window(model: str) -> int | None:
    """LiteLLM's window of ``model`` (its bundled model map does not change while we run)."""
    try:
        info = load_litellm().get_model_info(model)
    except Exception:  # LiteLLM raises several types for unmapped models
        return None
    value = info.get("max_input_tokens") or info.get("max_tokens")
    return int(value) if value else None


#: LiteLLM call arguments that price a call at zero (custom pricing, never sent to a provider).
_ZERO_PRICING = {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0}


def unpriced_model_pricing(model: str) -> dict[str, float]:
    """LiteLLM arguments that price a call of ``model`` at zero when LiteLLM's bundled model
    map has no price for it (a local server's model, the demo model); ``{}`` otherwise.

    LiteLLM works out a response's cost twice per call (stream end and success logging). For
    a model it cannot price it first searches its map for a similar model, which costs about
    a fifth of the call's CPU in this process and ends with no price anyway; with a custom
    price of zero it skips that search. A model the map prices keeps LiteLLM's own pricing.
    The platform prices calls itself (``agents_app.usage.pricing``). Imports LiteLLM.
    """
    return dict(_ZERO_PRICING) if _model_unpriced(model) else {}


def model_unpriced(model: str) -> bool:
    """Whether LiteLLM's bundled map has no token price for ``model`` (``agents_app.usage.pricing``
    prices such a call at zero). Imports LiteLLM."""
    return _model_unpriced(model)


@functools.lru_cache(maxsize=256)
def _model_unpriced(model: str) -> bool:
    """Whether LiteLLM's bundled map has no token price for ``model`` (it does not change)."""
    try:
        info = load_litellm().get_model_info(model)
    except Exception:  # LiteLLM raises several types for unmapped models
        return True
    return info.get("input_cost_per_token") is None and info.get("output_cost_per_token") is None


def supports_images(model: str, configured: bool | None = None) -> bool:
    """Whether ``model`` accepts images in its input.

    ``configured`` (the agent definition's ``supports_images``) wins; otherwise LiteLLM's
    model information (``litellm.supports_vision``), which is false for a model it does not
    know (a local server's model, the demo model). Imports LiteLLM.
    """
    if configured is not None:
        return configured
    return _model_vision(model)


@functools.lru_cache(maxsize=256)
def _model_vision(model: str) -> bool:
    """LiteLLM's ``supports_vision`` of ``model`` (its bundled model map does not change)."""
    try:
        return bool(load_litellm().supports_vision(model=model))
    except Exception:  # LiteLLM raises several types for unmapped models
        return False


def count_text_tokens(model: str, text: str) -> int:
    """Count the tokens of plain ``text`` (no message overhead) with LiteLLM's counter, as
    LiteLLM counts a streamed completion that reported no usage. Imports LiteLLM."""
    if not text:
        return 0
    counted: int = load_litellm().token_counter(model=model, text=text)
    return counted


def count_tokens(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> int:
    """Count the tokens of Chat Completions ``messages`` (and the ``tools`` offered with them)
    with LiteLLM's counter.

    Provider-only keys (``thinking_blocks``, ``reasoning_items``) are counted as their JSON text
    length / 4, since LiteLLM's counter does not know them. Imports LiteLLM.
    """
    import json

    litellm = load_litellm()
    plain: list[dict[str, Any]] = []
    extra = 0
    for message in messages:
        item = dict(message)
        for key in ("thinking_blocks", "reasoning_items"):
            if item.get(key):
                extra += len(json.dumps(item.pop(key))) // 4
            item.pop(key, None)
        plain.append(item)
    counted: int = litellm.token_counter(
        model=model, messages=plain, tools=[dict(tool) for tool in tools] if tools else None
    )
    return counted + extra
