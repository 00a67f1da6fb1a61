"""The MCP server: `server.build_server` wires the tool groups, each a few lines over serve/api."""
