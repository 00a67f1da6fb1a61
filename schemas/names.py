"""Names the tables and the settings share, importable without pyarrow (the MCP server's start-up
reads them before it opens a table)."""

PROJECT_SOURCE = "project"  # the `source` of the project's own files; other sources are named by `ctx add`
