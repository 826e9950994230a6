"""MCP test servers written with the mcp SDK; each runs as a script over stdio or streamable HTTP."""
