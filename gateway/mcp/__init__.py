"""MCP servers the operator allows (`--mcp-config`), run for the Responses API's `mcp` tool."""
