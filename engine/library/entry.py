"""One model found on this machine: where it is, what it is, and whether it fits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from engine.printable import printable

__all__ = ["SOURCE_NAMES", "LibraryEntry", "ModelFacts", "printable"]

# Which program's store the model was found in ("folder": a folder the user added).
Source = Literal["lmstudio", "ollama", "huggingface", "gpt4all", "jan", "llamacpp", "logitlab", "folder", "recent"]
Format = Literal["gguf", "safetensors"]
Fit = Literal["fits", "tight", "too big", "unknown"]

SOURCE_NAMES: dict[str, str] = {
    "lmstudio": "LM Studio",
    "ollama": "Ollama",
    "huggingface": "Hugging Face cache",
    "gpt4all": "GPT4All",
    "jan": "Jan",
    "llamacpp": "llama.cpp cache",
    "logitlab": "Logit Lab models",
    "folder": "your folder",
    "recent": "opened recently",  # a file or folder opened from elsewhere, read so its row has facts too
}


@dataclass(frozen=True)
class ModelFacts:
    """What a model's header or config says, read without loading weights; 0 or "" where it does not say."""

    architecture: str = ""
    parameters: int = 0
    quantization: str = ""  # "Q4_K_M", "BF16", "GPTQ 4-bit"
    context_length: int = 0
    weight_bytes: int = 0  # on disk, every part of a split model
    kv_bytes_per_token: int = 0  # 0 when the hyperparameters are not known


@dataclass(frozen=True)
class LibraryEntry:
    """A model in the library; `spec` is what Open passes to the engine (a path or a hub id).

    `problem` is set (and the facts empty) when the file was found but could not
    be read: a truncated download, a foreign file with a .gguf name.
    """

    name: str
    source: Source
    format: Format
    path: Path  # the .gguf file (the first part of a split model) or the model folder
    spec: str
    facts: ModelFacts
    memory_bytes: int  # estimated need: weights, the KV cache of the context it opens with here, overhead
    fit: Fit
    backend: str  # which backend "auto" picks for it here (engine.backends.select)
    problem: str = ""

    @property
    def source_name(self) -> str:
        return SOURCE_NAMES.get(self.source, self.source)

    @property
    def file_bytes(self) -> int:
        return self.facts.weight_bytes

    def matches(self, query: str) -> bool:
        """True when every word of `query` appears in the name, source, architecture, quantization or path."""
        words = query.lower().split()
        haystack = " ".join(
            (self.name, self.source_name, self.facts.architecture, self.facts.quantization, str(self.path), self.backend)
        ).lower()
        return all(w in haystack for w in words)
