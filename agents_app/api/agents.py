"""``GET /api/v1/agents/``: the enabled agents, with the tools a session of each may use.

May import: the domain's reads (``selectors``) and the models.
"""

from typing import Any

from drf_spectacular.utils import extend_schema_field, inline_serializer
from rest_framework import serializers
from rest_framework.generics import ListAPIView

from agents_app.models import AgentDefinition
from agents_app.selectors import agent_catalog
from agents_app.selectors.agent_catalog import agent_list_enabled


class AgentListApi(ListAPIView):
    """``GET /api/v1/agents/``: enabled agents, with the tools a session of each may use.

    ``tools`` lists exposed tool names; ``tool_details`` describes each (server, effect, whether
    it waits for approval) for the portal. Credentials never appear: only whether the agent's
    provider is configured, and, for staff, what is missing.
    """

    class AgentOutputSerializer(serializers.ModelSerializer):
        tools = serializers.SerializerMethodField()
        tool_details = serializers.SerializerMethodField()
        configured = serializers.SerializerMethodField()
        not_configured_reason = serializers.SerializerMethodField()

        class Meta:
            model = AgentDefinition
            fields = (
                "slug",
                "name",
                "description",
                "model",
                "tools",
                "tool_details",
                "configured",
                "not_configured_reason",
            )

        def get_tools(self, agent: AgentDefinition) -> list[str]:
            return [tool.exposed_name for tool in agent.exposed_tools()]

        @extend_schema_field(
            inline_serializer(
                "AgentTool",
                {
                    "name": serializers.CharField(),
                    "server": serializers.CharField(),
                    "tool": serializers.CharField(),
                    "title": serializers.CharField(),
                    "description": serializers.CharField(),
                    "effect": serializers.CharField(),
                    "requires_approval": serializers.BooleanField(),
                },
                many=True,
            )
        )
        def get_tool_details(self, agent: AgentDefinition) -> list[dict[str, Any]]:
            return agent_catalog.agent_tools_describe(agent=agent)

        def get_configured(self, agent: AgentDefinition) -> bool:
            return agent.provider_status().configured

        def get_not_configured_reason(self, agent: AgentDefinition) -> str | None:
            request = self.context.get("request")
            return agent_catalog.agent_not_configured_reason(
                agent=agent, user=getattr(request, "user", None)
            )

    serializer_class = AgentOutputSerializer

    def get_queryset(self) -> Any:
        return agent_list_enabled()
