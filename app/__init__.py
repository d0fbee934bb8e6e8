"""Logit Lab's window: chat with a local model and inspect every sampled token.

`app.state` holds the Qt-free model of the window (conversation trees with
their token records, sampling settings, presets) and its SQLite store;
`app.widgets` holds the views; `app.controllers.chat` and `app.controllers.engine_host` connect
them to `engine` through its public API only. Nothing here imports torch, mlx
or transformers (tests/app/test_boundaries.py checks it).
"""

__version__ = "0.1.0"
BUNDLE_ID = "org.logitlab.LogitLab"  # macOS bundle id; packaging/logitlab.spec reads it
