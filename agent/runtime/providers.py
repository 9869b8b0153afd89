"""Which model provider a run uses: `LLM_PROVIDER=openai` (`llm.OpenAIModelClient`) or `demo`
(`demo.DemoModelClient`).

The choice lives here, above both providers, so that neither imports the other: `demo` builds on the
shared types of `llm` (`ModelResult`, `ModelRoles`, `StreamProgress`), and `llm` knows nothing of `demo`.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from agent.runtime.demo import DemoModelClient
from agent.runtime.llm import ModelClient, OpenAIModelClient


def get_model_client() -> ModelClient:
    """The configured provider's client: `LLM_PROVIDER=openai` or `demo`."""
    provider = (settings.LLM_PROVIDER or "").lower()
    if provider == "demo":
        return DemoModelClient()
    if provider == "openai":
        return OpenAIModelClient()
    raise ImproperlyConfigured(f"LLM_PROVIDER must be 'openai' or 'demo', not {settings.LLM_PROVIDER!r}")
