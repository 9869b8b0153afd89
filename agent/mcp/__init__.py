"""MCP servers as toolsets (issue 46): configured servers' tools offered to runs through the tool boundary.

`config` reads `MCP_SERVERS`; `hub` keeps the connections (one event loop thread for the process);
`toolset` turns each discovered tool into a `ToolSpec`. Details: docs/mcp.md.
"""
