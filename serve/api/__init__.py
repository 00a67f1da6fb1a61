"""The one read layer every face (CLI, MCP server, service) calls: search, files, docs, memory, sources."""
