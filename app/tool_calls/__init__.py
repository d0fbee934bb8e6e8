"""Tool calling in the window, Qt-free: a chat's tools in its requests, each call read back with its confidence,
where its branches start, the MCP tools and the loop that runs approved calls (docs/tools.md, "In the window").

Not `app/tools/` (the docs' screenshot scripts).
"""
