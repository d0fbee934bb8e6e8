"""Tool calls in the window: the Tools dock, each call's block with its confidence, approval, MCP servers."""
