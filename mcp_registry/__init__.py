"""Trusted MCP servers, their discovered tools, and the mapping of annotations to effects."""
