"""Scripts that drive the real window for the docs' pictures (`python -m app.tools.loom_screenshot docs/`).

They are not part of the window a user runs; `--screenshot-dir` in `app/__main__.py` is the one way in from it.
"""
