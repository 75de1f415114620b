"""Provider readiness, key lookup and API choice (agents_app.providers), Django-free."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agents_app.providers import (
    LOCAL_SERVER_KEY,
    PROVIDERS,
    ProviderNotConfiguredError,
    choose_api,
    model_prefix,
    provider_status,
    resolve_api_key,
    unpriced_model_pricing,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-live-DO-NOT-SHOW-0123456789"


@pytest.mark.parametrize(
    ("model", "variable"),
    [
        ("openai/gpt-5-mini", "OPENAI_API_KEY"),
        ("anthropic/claude-sonnet-4-5", "ANTHROPIC_API_KEY"),
        ("gemini/gemini-2.5-flash", "GEMINI_API_KEY"),
        ("groq/llama-3.3-70b-versatile", "GROQ_API_KEY"),
    ],
)
def test_a_named_provider_is_configured_by_its_default_variable(model: str, variable: str) -> None:
    missing = provider_status(model, None, None, environ={})
    assert not missing.configured
    assert variable in missing.reason
    blank = provider_status(model, None, None, environ={variable: "  "})
    assert not blank.configured
    ready = provider_status(model, None, None, environ={variable: SECRET})
    assert ready.configured
    assert SECRET not in ready.reason
    assert resolve_api_key(model, None, None, environ={variable: SECRET}) == SECRET


def test_the_definition_s_variable_wins_over_the_provider_default() -> None:
    environ = {"OPENAI_API_KEY": SECRET}
    status = provider_status("openai/gpt-5-mini", "TEAM_OPENAI_KEY", None, environ=environ)
    assert not status.configured
    assert "TEAM_OPENAI_KEY" in status.reason
    assert SECRET not in status.reason
    environ["TEAM_OPENAI_KEY"] = "sk-team"
    assert provider_status("openai/gpt-5-mini", "TEAM_OPENAI_KEY", None, environ=environ).configured
    assert (
        resolve_api_key("openai/gpt-5-mini", "TEAM_OPENAI_KEY", None, environ=environ) == "sk-team"
    )


def test_openai_compatible_servers_need_no_key() -> None:
    base = "http://127.0.0.1:11434/v1"
    assert provider_status("openai/qwen2.5", None, base, environ={}).configured
    assert resolve_api_key("openai/qwen2.5", None, base, environ={}) == LOCAL_SERVER_KEY
    for model in ("ollama/llama3", "ollama_chat/llama3", "hosted_vllm/m", "lm_studio/m"):
        assert provider_status(model, None, None, environ={}).configured
        assert resolve_api_key(model, None, None, environ={}) is None
    # A local server behind a key still needs that key.
    assert not provider_status("openai/m", "VLLM_KEY", base, environ={}).configured


def test_unknown_and_malformed_definitions_are_not_configured() -> None:
    assert not provider_status("", None, None, environ={}).configured
    unknown = provider_status("mistral/mistral-large", None, None, environ={})
    assert not unknown.configured and "api_key_env" in unknown.reason
    assert not provider_status("gpt-4o", None, None, environ={}).configured
    bad_name = provider_status("openai/x", "NOT-A-NAME", None, environ={"NOT-A-NAME": "k"})
    assert not bad_name.configured
    odd = provider_status("openai/x", "ODD_KEY", None, environ={"ODD_KEY": "key\u00e9\x01"})
    assert not odd.configured
    assert "\u00e9" not in odd.reason


def test_resolving_a_missing_key_names_the_variable_never_a_value() -> None:
    with pytest.raises(ProviderNotConfiguredError, match="ANTHROPIC_API_KEY") as raised:
        resolve_api_key(
            "anthropic/claude-sonnet-4-5", None, None, environ={"OPENAI_API_KEY": SECRET}
        )
    assert SECRET not in str(raised.value)


def test_keys_are_read_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GROQ_API_KEY", raising=False)
    assert not provider_status("groq/llama", None, None).configured
    monkeypatch.setenv("GROQ_API_KEY", "gsk-now")
    assert provider_status("groq/llama", None, None).configured
    assert resolve_api_key("groq/llama", None, None) == "gsk-now"


def test_api_choice() -> None:
    assert choose_api("openai/gpt-5-mini", None, None) == "responses"
    assert choose_api("openai/gpt-5-mini", "https://proxy.example/v1", None) == "chat"
    assert choose_api("anthropic/claude", None, None) == "chat"
    assert choose_api("openai/gpt-5-mini", None, "chat") == "chat"
    assert choose_api("openai/local", "http://x/v1", "responses") == "responses"
    with pytest.raises(ValueError):
        choose_api("openai/gpt-5-mini", None, "assistants")


def test_model_prefix_and_the_provider_table() -> None:
    assert model_prefix("Anthropic/claude") == "anthropic"
    assert model_prefix("gpt-4o") is None
    assert model_prefix("openai/") is None
    prefixes = {provider.prefix for provider in PROVIDERS}
    assert {"openai", "anthropic", "gemini", "groq"} <= prefixes


def test_importing_providers_does_not_import_litellm() -> None:
    """The web process asks for provider status and must not pay LiteLLM's import."""
    code = (
        "import sys, agents_app.providers as p, agents_app.worker.runner\n"
        "p.provider_status('openai/gpt-5-mini', None, None)\n"
        "print('litellm' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_only_models_litellm_cannot_price_are_priced_at_zero() -> None:
    """The demo model and local servers' models get a custom price of zero (LiteLLM then skips
    its search for a similar priced model); a model LiteLLM prices keeps its own pricing."""
    zero = {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0}
    assert unpriced_model_pricing("openai/dexagents-demo") == zero
    assert unpriced_model_pricing("hosted_vllm/my-local-model") == zero
    assert unpriced_model_pricing("openai/gpt-4o-mini") == {}
    assert unpriced_model_pricing("anthropic/claude-sonnet-4-5") == {}
    unpriced_model_pricing("openai/dexagents-demo")["input_cost_per_token"] = 1.0
    assert unpriced_model_pricing("openai/dexagents-demo") == zero
