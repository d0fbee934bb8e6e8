"""The decode core: the loop that turns a request into events (loop.py), one answer row's token step
(row.py), its statistics (stats.py), the batched rows (batch_loop.py), step mode (step.py) and
the server's continuous batching (shared_batch.py, batch_inbox.py)."""
