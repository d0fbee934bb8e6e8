"""The app's SQLite database: the store (store.py) and its schema (schema.py), token records
(records.py), reading past damage (recovery.py, row_reader.py, stored_rows.py, message_fields.py),
writes when another connection holds the lock (write_lock.py, write_queue.py), and the settings
rows that belong to a chat (setting_keys.py). Qt-free."""
