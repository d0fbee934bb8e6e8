"""The classic sampler controls: temperature and the filters, the penalties, XTC (label, range, one-line tip)."""

from __future__ import annotations

from app.widgets.param_row import ParamSpec

FILTERS = (
    ParamSpec("temperature", "Temperature", "Divides the logits; 0 = greedy (always the most likely token)", 0.0, 5.0, 0.05, 2, 2.0, "0 (greedy)"),
    ParamSpec("top_k", "Top-k", "Keep the k most likely tokens; off = keep all", 0, 100000, 1, 0, 200, "off"),
    ParamSpec("top_p", "Top-p", "Keep the most likely tokens up to this total probability; 1 = off", 0.01, 1.0, 0.01, 2),
    ParamSpec("min_p", "Min-p", "Drop tokens below min-p × the top probability; off = 0", 0.0, 1.0, 0.01, 2, None, "off"),
    ParamSpec("typical_p", "Typical-p", "Locally typical sampling mass; 1 = off", 0.01, 1.0, 0.01, 2),
)
PENALTIES = (
    ParamSpec("repetition_penalty", "Repetition", "Divides the logits of recent tokens; 1 = off", 0.05, 3.0, 0.01, 2, 2.0),
    ParamSpec("presence_penalty", "Presence", "Subtracted once from every recent token's logit; 0 = off", -2.0, 2.0, 0.05, 2),
    ParamSpec("frequency_penalty", "Frequency", "Subtracted per occurrence of a recent token; 0 = off", -2.0, 2.0, 0.05, 2),
    ParamSpec("penalty_last_n", "Look back", "How many recent tokens the penalties see", -1, 32768, 1, 0, 1024, "all"),
)
XTC = (
    ParamSpec("xtc_probability", "XTC chance", "How often XTC removes the top choices; off = 0", 0.0, 1.0, 0.01, 2, None, "off"),
    ParamSpec("xtc_threshold", "XTC threshold", "Tokens above this probability count as top choices", 0.01, 0.5, 0.01, 2),
)
