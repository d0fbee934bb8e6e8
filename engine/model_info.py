"""What the UI and the CLI show about a loaded model, and the typed facts they branch on.

A caller never asks which backend runs a model; it asks a fact:
`info.runs_locally`, `info.server` (the server's facts when the model is on
one: it can sample there), `info.reports_top_n` (only the top N log-probs
of each step are known, not the whole distribution).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.runtime_settings import RuntimeFacts


@dataclass(frozen=True)
class ServerInfo:
    """What a model's server can do, found out on connect (engine/backends/remote/probe.py)."""

    kind: str  # "vllm", "sglang", "llama.cpp", "llama-cpp-python", "ollama", "lmstudio", "openai"
    host: str
    max_top_logprobs: int  # 0: no log-probs at all
    token_prompts: bool  # a prompt may be token ids
    tokenize: bool  # it has a tokenize endpoint
    prompt_logprobs: bool  # it scores a prompt (echo with logprobs)
    seed: bool  # its seeds proved reproducible

    @property
    def we_sample_ok(self) -> bool:
        """Whether our sampler can run on its top log-probs (else only the server can sample)."""
        return self.max_top_logprobs > 0 and self.tokenize

    @property
    def why_server_only(self) -> str:
        """Why we cannot sample on this server ("" when we can)."""
        if self.max_top_logprobs <= 0:
            return f"{self.host} returns no token log-probs, so only the server can sample"
        if not self.tokenize:
            return f"{self.host} has no tokenize endpoint, so only the server can sample"
        return ""

    def labels(self) -> tuple[str, ...]:
        """Short facts for people: `server=vllm`, `top_logprobs<=20`, `token_prompts`, ..."""
        out = [f"server={self.kind}", f"top_logprobs<={self.max_top_logprobs}"]
        out += [name for name, ok in (("token_prompts", self.token_prompts), ("tokenize", self.tokenize),
                                      ("prompt_logprobs", self.prompt_logprobs), ("seed", self.seed)) if ok]
        return tuple(out)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    spec: str
    path: str
    architecture: str
    parameters: int
    dtype: str
    context_length: int
    vocab_size: int
    bytes: int  # weights in memory
    backend: str
    device: str
    # Optional facts only some backends know; empty when they do not apply.
    quantization: str = ""  # GGUF file type, e.g. "Q4_K_M" (llamacpp)
    file_bytes: int = 0  # size of the model file on disk (llamacpp)
    revision: str = ""  # hub commit hash the weights were loaded at
    server: ServerInfo | None = None  # the model runs on this server (and can sample there); None: runs here
    reports_top_n: int = 0  # only the top N log-probs of a step are known; 0: the whole distribution
    # threads, context, GPU layers, batch size it runs with, what its KV cache costs, what can be set
    runtime: RuntimeFacts = field(default_factory=RuntimeFacts)

    @property
    def runs_locally(self) -> bool:
        """The weights are in this process: its tokenizer and forward cost no network round trip."""
        return self.server is None

    def to_dict(self) -> dict:
        return asdict(self)

    def summary_lines(self) -> list[str]:
        return [
            f"model:          {self.name}",
            f"spec:           {self.spec}",
            f"path:           {self.path}",
            f"architecture:   {self.architecture}",
            f"parameters:     {self.parameters:,} ({self.parameters / 1e6:.1f} M)",
            f"dtype:          {self.dtype}",
            f"context length: {self.context_length:,}",
            f"vocab size:     {self.vocab_size:,}",
            f"weights:        {self.bytes / 2**20:.1f} MiB",
            f"backend:        {self.backend}",
            f"device:         {self.device}",
        ] + [
            line
            for line, present in (
                (f"quantization:   {self.quantization}", self.quantization),
                (f"file size:      {self.file_bytes / 2**20:.1f} MiB", self.file_bytes),
                (f"revision:       {self.revision}", self.revision),
                (f"server:         {', '.join(self.server.labels())}" if self.server else "", self.server),
                (f"reports:        top {self.reports_top_n} log-probs per step", self.reports_top_n),
                (f"memory:         {self.runtime.summary()}", self.runtime.summary()),
                (f"context note:   {self.runtime.context_note}", self.runtime.context_note),
            )
            if present
        ]
