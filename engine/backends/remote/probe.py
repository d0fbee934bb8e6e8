"""What a server can do, found out once on connect with a few tiny requests.

- which models it serves (GET /v1/models) and what kind of server it is;
- the most top log-probs it accepts per token (we ask for as many as it allows);
- whether a completion prompt may be token ids (exact "we sample" without re-tokenizing);
- a tokenize endpoint (see `tokenizer.DIALECTS`);
- prompt log-probs (`echo` with logprobs: scoring a prompt);
- whether `seed` makes sampling reproducible.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from engine.backends.remote.client import ServerClient
from engine.backends.remote.errors import ServerError, ServerResponseError, UnknownServerModelError
from engine.backends.remote.tokenizer import TokenizeDialect, probe_tokenize
from engine.model_info import ServerInfo
from engine.printable import printable

log = logging.getLogger(__name__)

TOP_LOGPROBS_TRIES = (100, 50, 20, 10, 5, 1)  # the first one the server accepts is used
OWNER_KINDS = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llama.cpp", "library": "ollama", "ollama": "ollama",
               "organization_owner": "lmstudio", "lmstudio": "lmstudio"}


@dataclass(frozen=True)
class ServerCapabilities:
    kind: str  # "vllm", "sglang", "llama.cpp", "llama-cpp-python", "ollama", "lmstudio", "openai"
    model: str
    models: tuple[str, ...]
    max_top_logprobs: int  # 0: no log-probs at all
    token_prompts: bool
    tokenize: TokenizeDialect | None
    prompt_logprobs: bool
    seed: bool
    context_length: int = 0  # 0 = not reported
    n_vocab: int = 0  # the vocabulary's size as the server states it (llama.cpp: /v1/models meta.n_vocab); 0 = not
    # Whether it streams several choices for one request (the API's `n`): None until a loom run asks (asking
    # costs nothing: a server that ignores `n` still answers the first child); False once it ignored or refused
    # `n`, so later runs on this connection ask one child at a time (engine/backends/remote/many_choices.py).
    many_choices: bool | None = None

    def labels(self) -> tuple[str, ...]:
        """Short facts for the log line on connect (ModelInfo.server carries them to the app, typed)."""
        out = [f"server={self.kind}", f"top_logprobs<={self.max_top_logprobs}"]
        out += [name for name, ok in (("token_prompts", self.token_prompts), ("prompt_logprobs", self.prompt_logprobs),
                                      ("seed", self.seed)) if ok]
        if self.tokenize is not None:
            out.append(f"tokenize={self.tokenize.tokenize_path}")
        return tuple(out)

    @property
    def we_sample_ok(self) -> bool:
        return self.max_top_logprobs > 0 and self.tokenize is not None

    def server_info(self, host: str) -> ServerInfo:
        """The typed facts `ModelInfo.server` carries to the app."""
        return ServerInfo(
            kind=self.kind, host=host, max_top_logprobs=self.max_top_logprobs, token_prompts=self.token_prompts,
            tokenize=self.tokenize is not None, prompt_logprobs=self.prompt_logprobs, seed=self.seed,
        )


def list_models(client: ServerClient) -> list[dict]:
    doc = client.get_json("/models")
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise ServerResponseError(f"{client.options.host} answered /v1/models without a model list: is this an OpenAI-compatible server?")
    return [m for m in data if isinstance(m, dict) and "id" in m]


def choose_model(models: list[dict], wanted: str, host: str) -> dict:
    if not models:
        raise UnknownServerModelError(f"{host} serves no model")
    if not wanted:
        return models[0]
    for m in models:
        if m["id"] == wanted:
            return m
    names = ", ".join(printable(str(m["id"]))[:80] for m in models[:8])
    raise UnknownServerModelError(f"{host} has no model {wanted!r}; it serves: {names}")


def _complete(client: ServerClient, model: str, **body: object) -> dict | None:
    """One tiny completion; None when the server refuses this combination (4xx)."""
    try:
        return client.post_json("/completions", {"model": model, "max_tokens": 1, **body}, retry=False)
    except ServerResponseError as e:
        log.debug("probe %s refused: %s", sorted(body), e)
        return None


def _top(doc: dict | None) -> int:
    """How many alternatives the first generated token came with."""
    try:
        lp = doc["choices"][0]["logprobs"]  # type: ignore[index]  # None (a refused probe) is caught below
        if lp.get("content"):  # llama.cpp server / chat-style
            return len(lp["content"][0].get("top_logprobs") or [])
        return len(lp["top_logprobs"][0] or {})
    except (KeyError, IndexError, TypeError, AttributeError):
        return 0


def stated_vocab_size(value: object) -> int:
    """A vocabulary size as the server states it, or 0 when it states none a real model could have."""
    from engine.backends.remote.checks import MAX_TOKEN_ID

    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_TOKEN_ID + 1:
        return 0
    return value


def probe(client: ServerClient, wanted_model: str) -> ServerCapabilities:
    """Ask the server what it can do. Raises ServerError when it is not usable at all."""
    host = client.options.host
    models = list_models(client)  # also the first contact: connection and auth errors surface here
    chosen = choose_model(models, wanted_model, host)
    model = str(chosen["id"])
    owner = str(chosen.get("owned_by", "")).lower()
    tokenize = probe_tokenize(client, model)
    kind = OWNER_KINDS.get(owner, "openai")
    if tokenize is not None and tokenize.name == "llama-cpp-python":
        kind = "llama-cpp-python"
    elif tokenize is not None and kind == "openai" and tokenize.name == "vllm":
        kind = "vllm"
    prompt = "Hello"
    max_top = 0
    for n in TOP_LOGPROBS_TRIES:
        if _top(_complete(client, model, prompt=prompt, logprobs=n, temperature=0)) > 0:
            max_top = n
            break
    token_prompts = False
    if tokenize is not None:
        ids = client.post_json(tokenize.tokenize_path, {tokenize.text_key: prompt, **({"model": model} if tokenize.with_model else {})}, root=True)[tokenize.tokens_out]
        token_prompts = _complete(client, model, prompt=list(ids), temperature=0) is not None
    echo = _complete(client, model, prompt="Hello world, this is", echo=True, logprobs=1, temperature=0)
    try:
        prompt_logprobs = echo is not None and len(echo["choices"][0]["logprobs"]["tokens"]) >= 2
    except (KeyError, IndexError, TypeError):
        prompt_logprobs = False
    seed = _seed_reproducible(client, model)
    ctx = chosen.get("max_model_len") or chosen.get("context_length") or 0
    meta = chosen.get("meta")
    n_vocab = meta.get("n_vocab") if isinstance(meta, dict) else None
    return ServerCapabilities(
        kind=kind, model=model, models=tuple(str(m["id"]) for m in models), max_top_logprobs=max_top,
        token_prompts=token_prompts, tokenize=tokenize, prompt_logprobs=prompt_logprobs, seed=seed,
        context_length=int(ctx) if isinstance(ctx, int) else 0,
        n_vocab=stated_vocab_size(n_vocab),
    )


def _seed_reproducible(client: ServerClient, model: str) -> bool:
    """Two hot samples with one seed must agree.

    The first request warms the server's prompt cache and is not compared: the one after it reuses the cached
    prompt and recomputes only its last token, in another kernel whose last digits differ, and at temperature
    1.5 that can flip a draw (llama-cpp-python 0.3.36: "   'x', will be" cold, "  2358" warm, the same seed).
    Two warm answers are what every later request with that seed is like.
    """
    body = dict(prompt="A random word:", temperature=1.5, max_tokens=6, seed=1234)
    try:
        client.post_json("/completions", {"model": model, **body}, retry=False)
        a = client.post_json("/completions", {"model": model, **body}, retry=False)
        b = client.post_json("/completions", {"model": model, **body}, retry=False)
        return a["choices"][0]["text"] == b["choices"][0]["text"]
    except (ServerError, KeyError, IndexError, TypeError):
        return False
