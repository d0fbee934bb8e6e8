"""The CLI's sink: each served exchange as one trace file (engine.experiments.trace), readable by `read_trace`.

One file per request, `<record_dir>/<UTC time>-<answer id>.jsonl`, one run per choice. Each run's header has
the usual fields (model, settings, seed, prompt_ids) and `served`: the client, the endpoint, its messages or
prompt, whether it was proxied (and to where, and `upstream_top_n`: the most alternatives the upstream gave
a recorded token, null when it gave no log-probs and the tokens are its text pieces), how it ended. Written
whole or not at all (engine.atomic_file), when the answer ends; nothing is written while it runs.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from engine.atomic_file import write_text_atomic
from engine.events import TokenEvent
from engine.experiments.trace import dumps, generation_run
from engine.model_info import ModelInfo
from engine.serve.exchange import ServedExchange
from engine.serve.proxy_events import recorded_top

log = logging.getLogger(__name__)


def served_header(exchange: ServedExchange, choice: int) -> dict[str, Any]:
    header = _served_fields(exchange, choice)
    if exchange.proxied:  # what the record holds of the upstream's answer: its top-N, or text alone (None)
        events = next((c.events for c in exchange.choices if c.index == choice), ())
        header["upstream_top_n"] = recorded_top(events)
    return header


def _served_fields(exchange: ServedExchange, choice: int) -> dict[str, Any]:
    return {"id": exchange.id, "choice": choice, "n": exchange.n, "endpoint": exchange.endpoint,
            "client": exchange.client, "proxied": exchange.proxied, "upstream": exchange.upstream,
            "messages": list(exchange.messages) if exchange.messages is not None else None,
            "prompt": exchange.prompt, "stream": exchange.stream, "started_at": exchange.started_at,
            "finished_at": exchange.finished_at, "error": exchange.error, "stopped": exchange.stopped,
            "disconnected": exchange.disconnected}


def exchange_lines(exchange: ServedExchange, model: ModelInfo | dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every line of the exchange's trace: one generation run per choice."""
    model = model if model is not None else {"name": exchange.model, "backend": "remote" if exchange.proxied else None}
    lines: list[dict[str, Any]] = []
    for choice in exchange.choices:
        seed = choice.stats.seed if choice.stats is not None and choice.stats.seed >= 0 else None
        lines += generation_run(model=model, prompt_ids=exchange.prompt_ids or None, settings=exchange.sampler,
                                seed=seed, events=choice.events, stats=choice.stats,
                                end={"served_finish_reason": choice.finish_reason},
                                served=served_header(exchange, choice.index))
    return lines


class TraceDirectorySink:
    """Writes each exchange, when it ends, to its own trace file in `directory` (made when missing)."""

    def __init__(self, directory: str | Path, model: ModelInfo | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.model = model
        self.written: list[Path] = []

    def on_start(self, exchange: ServedExchange) -> None:
        pass

    def on_token(self, exchange_id: str, choice: int, event: TokenEvent) -> None:
        pass

    def on_end(self, exchange: ServedExchange) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(exchange.started_at))
        path = self.directory / f"{stamp}-{exchange.id}.jsonl"
        lines = exchange_lines(exchange, self.model)
        if not lines:
            return  # no choice ran (refused before the model's turn): nothing to replay
        write_text_atomic(path, "".join(dumps(line) + "\n" for line in lines))
        self.written.append(path)
        log.info("recorded %s", path)
