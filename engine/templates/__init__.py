"""Chat templates: which template a model gets (choice.py), rendering it (render.py), in a sandbox
(sandbox.py), and the out-of-process renderer (process.py)."""
