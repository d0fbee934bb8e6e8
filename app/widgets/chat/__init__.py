"""The conversation: the chat pane and transcript, each message and its token body, the composer and its attachments, the sidebar's chats and folders, notebook mode."""
