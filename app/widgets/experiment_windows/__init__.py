"""The experiment windows: Compare, Replay, Score, Compare models and the Loom."""
