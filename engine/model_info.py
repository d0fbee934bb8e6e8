"""What the UI and the CLI show about a loaded model."""

from __future__ import annotations

from dataclasses import asdict, dataclass


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
    capabilities: tuple[str, ...] = ()  # what a remote server accepts, e.g. ("top_logprobs<=20", "token_prompts")

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
                (f"capabilities:   {', '.join(self.capabilities)}", self.capabilities),
            )
            if present
        ]
