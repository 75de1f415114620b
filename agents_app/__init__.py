"""Agent definitions, the session index, the REST API and the Dex worker commands."""
