"""Qt-free state of the window: conversation trees, settings, presets, selection; and their SQLite store."""

from app.state.conversation import Conversation, Message
from app.state.conversation_list import Library
from app.state.observable import Signal
from app.state.settings import BUILTIN_PRESETS, GenerationOptions, Selection, SettingsState, ViewOptions
from app.state.database.store import Store

__all__ = [
    "BUILTIN_PRESETS",
    "Conversation",
    "GenerationOptions",
    "Library",
    "Message",
    "Selection",
    "SettingsState",
    "Signal",
    "Store",
    "ViewOptions",
]
