"""factory-boy factories shared by the Django app tests.

Call ``XFactory.create(...)`` / ``.build(...)`` (typed) rather than ``XFactory(...)``.
"""

from typing import Any

import factory
from django.contrib.auth import get_user_model

from agents_app.models import AgentDefinition, AgentSession
from mcp_registry.models import McpServer, McpTool


class UserFactory(factory.django.DjangoModelFactory[Any]):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda user: f"{user.username}@example.com")
    password = factory.django.Password("correct horse battery staple")


class McpServerFactory(factory.django.DjangoModelFactory[McpServer]):
    class Meta:
        model = McpServer

    name = factory.Sequence(lambda n: f"server{n}")
    transport = McpServer.Transport.STDIO
    command = "python"
    args: Any = factory.LazyFunction(lambda: ["-m", "example"])
    trust_annotations = True


class McpToolFactory(factory.django.DjangoModelFactory[McpTool]):
    class Meta:
        model = McpTool

    server = factory.SubFactory(McpServerFactory)
    name = factory.Sequence(lambda n: f"tool{n}")
    description = factory.LazyAttribute(lambda tool: f"The {tool.name} tool.")
    input_schema: Any = factory.LazyFunction(
        lambda: {"type": "object", "properties": {"q": {"type": "string"}}}
    )
    annotations: Any = factory.LazyFunction(lambda: {"readOnlyHint": True})


class AgentDefinitionFactory(factory.django.DjangoModelFactory[AgentDefinition]):
    class Meta:
        model = AgentDefinition
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"agent{n}")
    name = factory.LazyAttribute(lambda agent: agent.slug.title())
    model = "openai/dexagents-demo"
    api_base = "http://127.0.0.1:8811/v1"
    system_prompt = "Be brief."


class AgentSessionFactory(factory.django.DjangoModelFactory[AgentSession]):
    class Meta:
        model = AgentSession

    id = factory.Sequence(lambda n: f"ses_{n:032x}")
    owner = factory.SubFactory(UserFactory)
    agent = factory.SubFactory(AgentDefinitionFactory)
    title = "A session"
