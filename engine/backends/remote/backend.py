"""`RemoteBackend`: the 5-method Backend protocol over an OpenAI-compatible server ("we sample").

`forward` asks the server for the next token's top-N log-probs (N as large as
it allows) and returns a (V,) float32 vector with those N filled and -inf
elsewhere, so our sampler chain, stage snapshots, seeds and forced tokens run
unchanged on that truncated distribution. There is no local KV cache: the
"cache" is the token list we send; the server's own prefix caching makes a
repeated prefix cheap (vLLM, SGLang, llama.cpp).

Prompts are token ids where the server takes them; otherwise text, checked
to tokenize back to the same ids on the server, since a different
tokenization would be a different (and unreported) question.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import httpx

import numpy as np

from engine.backend import CachedTokens
from engine.backends.remote.client import ServerClient
from engine.backends.remote.errors import UnsupportedByServerError
from engine.backends.remote.options import ConnectionOptions, clean_spec, options_for
from engine.backends.remote.probe import ServerCapabilities, probe
from engine.backends.remote.step import next_token_top
from engine.backends.remote.tokenizer import MissingTokenizer, RemoteTokenizer, check_server_token_ids
from engine.model_info import ModelInfo
from engine.fingerprints.record import NumericSetup
from engine.printable import printable

if TYPE_CHECKING:
    import threading

    from engine.backends.remote.runner import RemoteRunner
    from engine.events import Event
    from engine.request import GenerationRequest
    from engine.sources.progress import ProgressCallback

log = logging.getLogger(__name__)

VOCAB_ROUND = 1024  # the logits vector grows in these steps when the server does not report its vocabulary size
MAX_TOP_N = 64  # more alternatives cost tokenize calls (text-keyed servers) for mass that is ~0


class RemoteBackend(CachedTokens):
    name = "remote"

    def __init__(
        self, client: ServerClient, caps: ServerCapabilities, tokenizer: RemoteTokenizer | None, spec: str
    ) -> None:
        self.client = client
        self.caps = caps
        self.server_tokenizer = tokenizer  # None: the server has no tokenize endpoint (server sampling on text only)
        self.top_n = min(caps.max_top_logprobs, MAX_TOP_N)
        self._tokens: list[int] = []
        self.retokenized = 0  # times a text-only server read our tokens differently (see `_prompt`)
        self._vocab = VOCAB_ROUND
        self.info = ModelInfo(
            name=printable(caps.model.rsplit("/", 1)[-1]),  # the server's words: shown escaped
            spec=spec,
            path=client.options.base_url,
            architecture="remote",
            parameters=0,
            dtype="",
            context_length=caps.context_length,
            vocab_size=0,
            bytes=0,
            backend="remote",
            device=client.options.host,
            server=caps.server_info(client.options.host),
            reports_top_n=self.top_n,
        )

    def numeric_facts(self) -> NumericSetup:
        """What is known here of how the server computes (NumericFacts): its kind and model, and the top N
        log-probs it reports (the sampler sees only those); its own threads and versions are the server's."""
        return NumericSetup(device=self.info.device, settings=(
            ("server", self.caps.server_info(self.client.options.host).kind), ("server_model", self.caps.model),
            ("top_logprobs", self.top_n)))

    @classmethod
    def connect(cls, spec: str, progress: ProgressCallback | None = None, transport: httpx.BaseTransport | None = None,
                **overrides: Any) -> RemoteBackend:  # overrides: ConnectionOptions' fields (options_for)
        """Reach the server, pick the model, probe what it can do. Raises a ServerError on failure."""
        options: ConnectionOptions = options_for(spec, **overrides)
        if progress:
            progress(f"connecting to {options.host}", None)
        client = ServerClient(options, transport=transport)
        try:
            caps = probe(client, options.model)
            client.options = ConnectionOptions(**{**options.__dict__, "model": caps.model})
            tokenizer = RemoteTokenizer(client, caps.model, caps.tokenize, caps.n_vocab) if caps.tokenize else None
        except BaseException:
            client.close()
            raise
        log.info("connected to %s: %s (%s)", options.host, caps.model, ", ".join(caps.labels()))
        return cls(client, caps, tokenizer, clean_spec(spec))  # credentials in the URL are never shown or stored

    @property
    def tokenizer(self) -> RemoteTokenizer | MissingTokenizer:
        """The server's tokenizer; on a server without a tokenize endpoint, one whose every use says so in words
        (code here asks `server_tokenizer`, which is None there)."""
        if self.server_tokenizer is None:
            return MissingTokenizer(self.client.options.host)
        return self.server_tokenizer

    # --- the Backend protocol ------------------------------------------------------

    def _cut_cache(self, keep: int) -> bool:
        return True  # nothing to free here: the next request simply sends the shorter prefix

    def _clear_cache(self) -> None:
        pass

    def forward(self, token_ids: Sequence[int]) -> np.ndarray:
        """Extend the sequence by `token_ids`; the server's top-N log-probs as a (V,) float32 vector.

        Inside `client.cancellable(event)`, setting the event ends a request in flight at once.
        """
        self.require_we_sample()
        check_server_token_ids(token_ids, self.caps.n_vocab)  # prompt, forced and step-mode ids enter here
        self._tokens.extend(int(t) for t in token_ids)
        top = next_token_top(self.client, self.caps.model, self._prompt(), self.top_n, self.server_tokenizer, self.caps.kind)
        high = max([i for i, _, _ in top] + self._tokens[-1:], default=0)
        if high >= self._vocab:
            self._vocab = (high // VOCAB_ROUND + 1) * VOCAB_ROUND
        logits = np.full(self._vocab, -np.inf, dtype=np.float32)  # (V,)
        for tid, _text, lp in top:
            if math.isfinite(lp) and logits[tid] == -np.inf:  # text-keyed duplicates: keep the first (largest)
                logits[tid] = lp
        return logits

    def peak_memory_bytes(self) -> int:
        return 0  # the memory is the server's

    def close(self) -> None:
        self.client.close()

    # --- capabilities (engine.capabilities) ----------------------------------------------

    def events(self, request: GenerationRequest, cancel: threading.Event | None) -> Iterator[Event]:
        """OwnEvents: the server samples (request.server_sampling), or we do over its top N, noted so."""
        from engine.backends.remote.generate import remote_events

        return remote_events(self, request, cancel)

    def children_events(self, request: GenerationRequest, seeds: Sequence[int], cancel: threading.Event
                        ) -> Iterator[tuple[int, Event]]:
        """ServerChildren: N server-sampled children in one request (the API's `n`), one by one where it cannot."""
        from engine.backends.remote.many_choices import children_events

        return children_events(self, request, seeds, cancel)

    def batch_runner(self) -> RemoteRunner:
        """BatchRunners: one request per row and step, the server's top N as each row's logits."""
        from engine.backends.remote.runner import RemoteRunner

        return RemoteRunner(self)

    def round_trip_s(self) -> float | None:
        """RoundTrip: seconds the last complete request took, network and the server's work."""
        return self.client.last_latency_s

    # --- helpers for the remote package --------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._vocab

    def require_we_sample(self) -> None:
        """Raise UnsupportedByServerError, saying what to do instead, when our sampler cannot run on this server."""
        if self.caps.we_sample_ok:
            return
        host = self.client.options.host
        why = "returns no token log-probs" if self.caps.max_top_logprobs <= 0 else "has no tokenize endpoint"
        raise UnsupportedByServerError(
            f"{host} {why}, so only the server can sample there: use server sampling "
            "(logitlab-cli --server-sampling; in the window, tick “The server samples”)"
        )

    def _prompt(self) -> str | list[int]:
        if self.caps.token_prompts:
            return list(self._tokens)
        assert self.server_tokenizer is not None
        text = self.server_tokenizer.text_for(self._tokens)
        again = self.server_tokenizer.encode(text)  # the round-trip check (cached: the next step's prefix)
        if again != self._tokens:
            # The server will read this text as other tokens (e.g. "\n" + "\n" becomes "\n\n"). It cannot be
            # told otherwise, so continue from its reading of the same text; the answer's text is unchanged.
            k = next((i for i, (a, b) in enumerate(zip(again, self._tokens)) if a != b), min(len(again), len(self._tokens)))
            log.warning(
                "%s takes text prompts only and reads these %d tokens differently from token %d on; "
                "continuing from its own tokenization (token-id prompts would avoid this)",
                self.client.options.host, len(self._tokens), k,
            )
            self.retokenized += 1
            self._tokens = list(again)
        return text
