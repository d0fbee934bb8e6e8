"""The settings-table keys that belong to one chat or one message (Qt-free): written by app/state/tool_settings.py,
and deleted by the store with the chat they belong to, so a deleted chat leaves no row behind."""

from __future__ import annotations

from collections.abc import Iterable


def chat_tools_key(conversation_id: int) -> str:
    return f"tools of chat {conversation_id}"


def tool_results_key(message_id: int) -> str:
    return f"tool results of message {message_id}"


def keys_of_chat(conversation_id: int, message_ids: Iterable[int]) -> list[str]:
    """Every settings key a chat and its messages may have."""
    return [chat_tools_key(conversation_id), *(tool_results_key(m) for m in message_ids)]
