"""The record over MCP: a read-only MCP endpoint for other agents and IDEs (docs/mcp.md).

`asgi` mounts it and authenticates each request with an API token, `server` is the MCP server (tools and
runbook resources), `reads` what each tool reads through the REST API's selectors, `metrics` the counts.
"""
