"""GenieX as an MCP server (`/mcp`, docs/mcp.md "GenieX as an MCP server"): its local models as
tools for MCP clients (Claude Desktop, VS Code), over MCP's Streamable HTTP transport."""
