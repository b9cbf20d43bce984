"""GET /v1/mcp/servers: the MCP servers the caller's key may use, each with its tools (GenieX's own
route, for the web UI and for clients choosing an `mcp` tool's `allowed_tools`).

Listing starts a stdio server that has not run yet, as its first use would; a server that cannot
list its tools is shown with its error rather than failing the whole list.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from litestar import Request, Response, get
from litestar.di import NamedDependency

from gateway.http.auth import mcp_servers_of
from gateway.http.services import Services
from gateway.mcp.hub import Hub, McpTool, Unavailable
from gateway.supervisor.deadline import within


class ServerTool(msgspec.Struct, kw_only=True):
    name: str
    description: str | None
    input_schema: dict[str, Any]
    read_only: bool


class McpServer(msgspec.Struct, kw_only=True):
    server_label: str
    transport: str  # stdio or http
    tools: list[ServerTool]
    error: str | None = None


class McpServers(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[McpServer]


async def _server(hub: Hub, label: str) -> McpServer:
    try:
        tools: list[McpTool] = await hub.tools(label)
        error = None
    except Unavailable as exc:
        tools, error = [], str(exc)
    return McpServer(server_label=label, transport=hub.configs[label].transport, error=error,
                     tools=[ServerTool(name=t.name, description=t.description, input_schema=t.input_schema,
                                       read_only=t.read_only) for t in tools])  # fmt: skip


@get("/v1/mcp/servers")
async def list_servers(request: Request, services: NamedDependency[Services]) -> Response[McpServers]:
    may = mcp_servers_of(request)
    labels = [label for label in services.mcp.labels if may is None or label in may]
    servers = await within(asyncio.gather(*(_server(services.mcp, label) for label in labels)))
    return Response(McpServers(data=list(servers)))


handlers = [list_servers]
