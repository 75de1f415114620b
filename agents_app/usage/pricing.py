"""What one model call cost, in US dollars (issue 27 "Cost and usage").

The worker prices every model call as it records its usage (``AgentUsage.cost_usd``, a decimal
string). Two sources, in this order:

1. The agent definition's own prices (``AgentDefinition.input_price_per_mtok`` and
   ``output_price_per_mtok``, US dollars per million tokens, carried in the session's
   ``agent_config`` as decimal strings): ``input_tokens * input price + output_tokens * output
   price``, divided by one million, exactly. Cached input tokens are part of ``input_tokens``
   and cost the input price; a price left unset counts as zero.
2. Otherwise LiteLLM's cost map, the copy shipped inside the installed LiteLLM package and read
   locally (``LITELLM_LOCAL_MODEL_COST_MAP=True``; nothing is fetched): ``litellm.cost_per_token``
   with the call's usage, so a provider's cached-input price applies. Its floats are rounded to
   12 decimal places (a millionth of a micro-dollar).

A model the map does not know (a local server's model, the demo model ``openai/...``) costs
``"0"``: the call still counts its tokens and requests.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from decimal import Decimal, InvalidOperation
from typing import Any

from agents_app.providers import load_litellm, model_unpriced
from dex_agents import AgentUsage, usd_text

logger = logging.getLogger(__name__)

#: Prices are per this many tokens.
TOKENS_PER_PRICE_UNIT = Decimal(1_000_000)
#: LiteLLM's float costs are kept to this many decimal places.
_MAP_PLACES = Decimal("1e-12")


class PriceConfigError(ValueError):
    """An agent config price that is not a non-negative decimal number."""


def config_price(config: Mapping[str, Any] | None, key: str) -> Decimal | None:
    """The price under ``key`` of an ``agent_config`` (USD per million tokens), or ``None``
    when it is absent.

    Raises:
        PriceConfigError: The value is not a finite, non-negative decimal number.
    """
    value = (config or {}).get(key)
    if value is None or value == "":
        return None
    try:
        price = Decimal(str(value))
    except InvalidOperation as error:
        raise PriceConfigError(f"agent_config {key!r} must be a decimal number") from error
    if not price.is_finite() or price < 0:
        raise PriceConfigError(f"agent_config {key!r} must be a non-negative number")
    return price


def usage_priced(
    usage: AgentUsage,
    *,
    model: str,
    input_price_per_mtok: Decimal | None,
    output_price_per_mtok: Decimal | None,
) -> AgentUsage:
    """``usage`` with ``cost_usd`` set for one call of ``model`` (sources in the module
    docstring). Never raises for an unknown model: its cost is ``"0"``. Imports LiteLLM when
    the agent sets no price."""
    return replace(
        usage,
        cost_usd=usd_text(
            call_cost(
                usage,
                model=model,
                input_price_per_mtok=input_price_per_mtok,
                output_price_per_mtok=output_price_per_mtok,
            )
        ),
    )


def call_cost(
    usage: AgentUsage,
    *,
    model: str,
    input_price_per_mtok: Decimal | None,
    output_price_per_mtok: Decimal | None,
) -> Decimal:
    """The cost in US dollars of one call with ``usage`` (see the module docstring)."""
    if input_price_per_mtok is not None or output_price_per_mtok is not None:
        spent = usage.input_tokens * (input_price_per_mtok or 0) + usage.output_tokens * (
            output_price_per_mtok or 0
        )
        return Decimal(spent) / TOKENS_PER_PRICE_UNIT
    if model_unpriced(model):
        return Decimal(0)
    litellm = load_litellm()
    from litellm.types.utils import PromptTokensDetailsWrapper, Usage

    details = (
        PromptTokensDetailsWrapper(cached_tokens=usage.cached_input_tokens)
        if usage.cached_input_tokens
        else None
    )
    try:
        prompt_cost, completion_cost = litellm.cost_per_token(
            model=model,
            usage_object=Usage(
                prompt_tokens=usage.input_tokens,
                completion_tokens=usage.output_tokens,
                total_tokens=usage.input_tokens + usage.output_tokens,
                prompt_tokens_details=details,
            ),
        )
    except Exception as error:  # LiteLLM raises several types for models it cannot price
        logger.info("No price for %s: %s", model, type(error).__name__)
        return Decimal(0)
    return Decimal(repr(float(prompt_cost) + float(completion_cost))).quantize(_MAP_PLACES)
