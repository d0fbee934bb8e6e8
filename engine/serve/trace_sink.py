"""The CLI's sink: each served exchange as one trace file (engine.experiments.trace), readable by `read_trace`.

One file per request, `<record_dir>/<UTC time>-<answer id>.jsonl`, one run per choice. Each run's header has
the usual fields (model, settings, seed, prompt_ids) and `served`: the client, the endpoint, its messages or
prompt, whether it was proxied (and to where, and `upstream_top_n`: the most alternatives the upstream gave
a recorded token, null when it gave no log-probs and the tokens are its text pieces), how it ended. Written
whole or not at all (engine.atomic_file), when the answer ends, so a `*.jsonl` there is always a whole record.

While an answer runs its record is written as it goes (issue 43 item 9: an endless upstream stream was a
record that reached disk only at its end, if ever): per choice, `<UTC time>-<answer id>.<choice>.live` gets
the run's header as it stood at the start, then each token's line as it comes (flushed, so a reader sees it
at once). It is the same trace format without its end line (`read_trace` reads it); the sink keeps only the
open file, no tokens. When the answer ends the whole `.jsonl` is written and the `.live` files are removed;
a server that dies mid-answer leaves them, with every token sent until then.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import IO, Any

from engine.atomic_file import write_text_atomic
from engine.events import TokenEvent
from engine.experiments.trace import dumps, generation_run, header, token_line
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
    model = _model(exchange, model)
    lines: list[dict[str, Any]] = []
    for choice in exchange.choices:
        seed = choice.stats.seed if choice.stats is not None and choice.stats.seed >= 0 else None
        lines += generation_run(model=model, prompt_ids=exchange.prompt_ids or None, settings=exchange.sampler,
                                seed=seed, events=choice.events, stats=choice.stats,
                                end={"served_finish_reason": choice.finish_reason},
                                served=served_header(exchange, choice.index))
    return lines


def _model(exchange: ServedExchange, model: ModelInfo | dict[str, Any] | None) -> ModelInfo | dict[str, Any]:
    return model if model is not None else {"name": exchange.model, "backend": "remote" if exchange.proxied else None}


MAX_OPEN_LIVE = 64  # live files held open at once, all answers together: beyond it a token's line is appended
# with an open and a close (27 us a line instead of 8, measured) so that a request of 1,024 choices, or many
# clients, cannot take the descriptors the server's sockets need


class _Live:
    """One running answer's record in progress: its `.live` files, begun at each choice's first token."""

    def __init__(self, exchange: ServedExchange, stem: Path) -> None:
        self.exchange = exchange  # as at on_start: no choices, so no tokens held
        self.stem = stem
        self.files: dict[int, IO[str]] = {}  # the choices whose file is held open
        self.begun: set[int] = set()  # the choices whose file has its header
        self.failed = False  # a write failed (a full disk): the rest goes only to the whole file at the end

    def path(self, choice: int) -> Path:
        return self.stem.with_name(f"{self.stem.name}.{choice}.live")

    def close(self, remove: bool = True) -> None:
        for out in self.files.values():
            out.close()
        self.files.clear()
        if remove:
            for choice in self.begun:
                self.path(choice).unlink(missing_ok=True)


class TraceDirectorySink:
    """Writes each exchange to its own trace file in `directory` (made when missing): as it runs to `.live`
    files, whole to `.jsonl` when it ends."""

    def __init__(self, directory: str | Path, model: ModelInfo | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.model = model
        self.written: list[Path] = []
        self._live: dict[str, _Live] = {}  # by exchange id; every call comes on the server's event-loop thread
        self._open = 0  # live files held open, all answers together

    def _stem(self, exchange: ServedExchange) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(exchange.started_at))
        return self.directory / f"{stamp}-{exchange.id}"

    def on_start(self, exchange: ServedExchange) -> None:
        self._live[exchange.id] = _Live(exchange, self._stem(exchange))

    def on_token(self, exchange_id: str, choice: int, event: TokenEvent) -> None:
        live = self._live.get(exchange_id)
        if live is None or live.failed:
            return
        text = dumps(token_line(event)) + "\n"
        try:
            if choice not in live.begun:
                text = dumps(self._live_header(live.exchange, choice)) + "\n" + text
                if self._open < MAX_OPEN_LIVE:
                    live.files[choice] = open(live.path(choice), "w", encoding="utf-8", newline="")
                    self._open += 1
                live.begun.add(choice)
            out = live.files.get(choice)
            if out is not None:
                out.write(text)
                out.flush()  # to the OS, not fsync: a reader sees it now; the whole file at the end is the durable one
            else:
                with open(live.path(choice), "a", encoding="utf-8", newline="") as out:
                    out.write(text)
        except (OSError, ValueError):  # ValueError: a value JSON cannot hold; the whole file will say so too
            live.failed = True  # logged once, not once per token; the whole record is still tried at the end
            log.exception("the live record of %s could not be written; it is written whole when it ends",
                          exchange_id)

    def _live_header(self, exchange: ServedExchange, choice: int) -> dict[str, Any]:
        """The run's header as at the start (no end time, no error, no `upstream_top_n`: no token was seen yet);
        the whole file's is the final one."""
        sampler = exchange.sampler
        return header(kind="generation", model=_model(exchange, self.model), prompt_ids=exchange.prompt_ids or None,
                      settings=sampler, seed=sampler.seed if sampler is not None else None,
                      served=_served_fields(exchange, choice))

    def on_end(self, exchange: ServedExchange) -> None:
        live = self._live.pop(exchange.id, None)
        if live is not None:
            self._open -= len(live.files)
        lines = exchange_lines(exchange, self.model)
        if lines:  # else no choice ran (refused before the model's turn): nothing to replay
            path = Path(f"{self._stem(exchange)}.jsonl")
            try:
                write_text_atomic(path, "".join(dumps(line) + "\n" for line in lines))
            except BaseException:
                if live is not None:
                    live.close(remove=False)  # the whole file failed: what streamed stays on disk
                raise
            self.written.append(path)
            log.info("recorded %s", path)
        if live is not None:
            live.close()  # after the whole file is in place: the tokens were on disk all along
