"""Logit Lab as an OpenAI-compatible server: any OpenAI client talks to the loaded `Engine`, and every token it
served is recorded with its top-N and sampler stages (issue 34). `logitlab-cli serve` and the window's
Serve... are both built on `start_server`. docs/serve.md says what is supported and what is refused.

The seam for a window (or any other viewer)::

    from engine.serve import ExchangeSink, RunningServer, ServedExchange, ServeOptions, start_server

    server: RunningServer = start_server(engine, host="127.0.0.1", port=0, api_key=None, sink=my_sink,
                                         options=ServeOptions(top_n=20, record_stages=True))
    server.url                  # "http://127.0.0.1:PORT/v1": what an OpenAI client's base_url takes
    server.stop_request(id)     # the window's Stop for one answer (ServedExchange.id); thread-safe
    server.active_requests()    # ids of the answers under way or waiting; thread-safe
    server.stop()               # stop serving: answers under way are cancelled, the thread is joined

- `start_server(engine=None, host="127.0.0.1", port=0, api_key=None, sink=None, *, upstream=None,
  upstream_api_key=None, options=ServeOptions()) -> RunningServer`: returns once the server listens. It runs
  uvicorn on its own daemon thread ("logitlab-serve-PORT") with its own asyncio loop, so the caller's loop
  (the window's qasync loop) never waits on it; generations run on the engine's worker thread, one served
  turn at a time (taking turns between clients; requests that waited together share a turn as rows of one
  batch where the model has batch runners, and on llama.cpp later ones join a batch under way while nobody
  waits), so a chat of the window's own waits at most one served turn (a batch takes no newcomers once it
  waits). `upstream=URL` is proxy mode (no engine). Raises `ServeSetupError` (a ValueError, one line of words): a non-loopback host without
  an API key, a port that is taken, neither an engine nor an upstream.
- `ServeOptions` (engine.serve.service; defaults and their reasons in engine.serve.limits): `top_n`,
  `record_stages`, `max_waiting`, `cont_batching`, `proxy` (engine.serve.proxy_limits), and what one connection
  may hold (engine.serve.connections): `header_timeout_s` (request line and headers within it, else 408 and
  closed; default 10), `body_timeout_s` (the body within it of the headers, else 408 and closed; default 30;
  the CLI's `--timeout`), `max_connections` (open at once; past it 503 and closed; default 512, lowered to the
  open-file limit less 128). None: no limit. `connection_cap(n)` in engine.serve.running gives the cap in force.
- `sink`: an `ExchangeSink` (or a list of them), three methods, **called on the server's thread**, between
  tokens of every client, so each must return quickly (a window hands the call to its own thread, e.g.
  `loop.call_soon_threadsafe` on the qasync loop or a queued Qt signal, and batches tokens to the frame rate):

  - `on_start(exchange: ServedExchange)`: the request was read and checked (a refused request makes none);
    `exchange.choices` is `()`; `exchange.id` names the answer in every later call;
  - `on_token(exchange_id: str, choice: int, event: TokenEvent)`: one more token of choice `choice`;
  - `on_end(exchange: ServedExchange)`: the same exchange, whole: `choices[i].events` (every TokenEvent,
    the end-of-sequence token included), `.stats` (GenerationStats; None when the client went away first),
    `.finish_reason` as the client was told ("stop", "length", "error"; "cancelled" when it went away), and
    `error`, `stopped` (ended by `stop_request`), `disconnected`.

  An exception in a sink is logged; the client's answer goes on.
- `ServedExchange` (frozen): `id`, `endpoint` ("chat.completions" / "completions" / "responses" /
  "messages"), `model`, `client` ("host:port"), `proxied`, `upstream`, `messages` (chat, Responses and
  Messages: the conversation as chat messages, text parts joined), `prompt` (a text completion),
  `prompt_ids` (the tokens the model continued; () when proxied), `sampler` (our `SamplerSettings`, as read
  from the client's fields), `request` (the `GenerationRequest` the engine ran; with `choices[0].stats.seed` as
  its sampler's seed it gives the same answer again; None when proxied), `n`, `stream`, `body` (the client's JSON), `started_at`,
  `finished_at`, `choices` (`ServedChoice(index, events, stats, finish_reason)`), `seed`.
- Stop: `stop_request(id)` ends that answer before its next token; a streaming client then gets a last
  chunk with `finish_reason: "stop"` and `[DONE]`; a client that asked for a whole answer gets the text so
  far with "stop". A client
  that disconnects cancels its generation the same way (`disconnected=True`).
- `engine.serve.trace_sink.TraceDirectorySink(directory, model_info)`: the CLI's sink (`--record-dir`), one
  trace file per exchange that `engine.experiments.read_trace` reads (one run per choice; the header's
  `served` field holds the client, endpoint, messages/prompt, proxied/upstream and how it ended); while it streams, each
  choice's tokens so far in a `.live` file beside it, removed once the whole `.jsonl` is written.

Files, one job each: `app.py` (routes, API key, error JSON), `body.py` (size, depth, JSON), `fields.py`
(typed field readers), `parse.py` (body -> GenerationRequest through the llama.cpp mapping), `responses.py`
(OpenAI response and chunk shapes, log-probs), `service.py` (engine mode: run, record, stop),
`engine_run.py` (the engine's events on the loop; `n` through the loom's batch; a shared batch's riders),
`fair_queue.py` (turns per client, and the riders that share one), `model_routes.py` (models, tokenize,
detokenize, props), `proxy.py` + `proxy_events.py` (proxy mode), `exchange.py` (the record and the sink
protocol), `trace_sink.py`, `running.py` (the thread), `connections.py` (header deadline, connection cap, the
repeat limit on the log), `limits.py`, `errors.py`.
"""

from engine.serve.exchange import ExchangeSink, ServedChoice, ServedExchange
from engine.serve.running import RunningServer, ServeSetupError, is_loopback, start_server
from engine.serve.service import ServeOptions

__all__ = ["ExchangeSink", "RunningServer", "ServeOptions", "ServeSetupError", "ServedChoice", "ServedExchange",
           "is_loopback", "start_server"]
