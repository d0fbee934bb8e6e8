"""Logit Lab engine: load a local language model, generate token by token, and inspect every choice.

Usable without the app::

    from engine import Engine, GenerationRequest, SamplerSettings
    with Engine.load() as eng:  # the default model
        for event in eng.generate(GenerationRequest(prompt="The capital of France is",
                                                   sampler=SamplerSettings(temperature=0))):
            ...
"""

from engine.backends.select import BACKEND_TABLE, BACKENDS, backend_help, user_backends  # the backend table
from engine.chat import ChatSession
from engine.atomic_file import atomic_text_file, write_text_atomic  # a file whole or not at all (exports)
from engine.engine import Engine
from engine.templates.process import shutdown as end_template_renders  # renders under way end; the next starts anew
from engine.worker import busy_workers, close_all  # every model thread of the process: what is busy; close them at exit
from engine.errors import (
    ContextLengthError,
    EngineError,
    GenerationCancelled,
    HubUnreachableError,
    ModelLoadError,
    ModelNotFoundError,
    RemoteCodeRefusedError,
    TokenIdError,
)
from engine.events import ConstraintStep, Done, GenerationStats, Rewind, StageSnapshot, TokenEvent, TokenProb
from engine.lazy_tuple import LazyTuple  # TokenEvent.stages as the decode loop hands them out: built when read
from engine.fingerprints.record import Fingerprint  # what an answer's numbers depend on (GenerationStats.fingerprint)
from engine.constraints import KIND_LABELS as CONSTRAINT_KINDS, Constraint, ConstraintError
from engine import experiments  # score, compare, token diff, JSONL traces (engine.experiments)
from engine.experiments.audit import LoomAudit  # what Engine.start_audit_rows gives (the loom's audit)
from engine import loom  # N continuations from one prefix, step mode (engine.loom)
from engine import library  # models on this machine, and downloads (engine.library)
from engine.templates import choice as template_choice  # built-in and chosen chat templates, which one a model uses
from engine import reasoning  # <think>…</think> in answers and in the next turn's prompt (engine.reasoning)
from engine import lens  # the layer view (logit lens) and attention of a position (engine.lens)
from engine import documents  # files attached to a message: read, checked, inserted (engine.documents)
from engine import steering  # control vectors: load, save, train, apply, what they did (engine.steering)
from engine import tools  # tool calling: tools checked, their calls parsed (engine.tools, docs/tools.md)
from engine.tools.confidence import CallConfidence, call_confidence  # what the model decided in each call
from engine.tools.mcp_config import McpConfigError, read_mcp_config  # an mcp.json, checked (engine.tools.mcp_config)
from engine.tools.mcp_hub import McpHub  # its servers' tools behind blocking calls (engine.tools.mcp_hub)
from engine.open_model import load_model
from engine.sources.remote_code import custom_code_files
from engine.sources.default_model import DefaultModelMissingError, default_model_path, download_default_model, models_dir
from engine.model_info import ModelInfo, ServerInfo
from engine.request import GenerationRequest
from engine.runtime_settings import INT32_MAX, RuntimeFacts, RuntimeSettings
from engine.servers import (
    list_server_models,
    remember_connection,
    server_sampler_fields,
    split_server_credentials,
    split_server_spec,
)
from engine.sampling.settings import DEFAULT_ORDER, DEFAULT_SAMPLER, STAGE_NAMES, SamplerSettings
from engine.sampling import Pick, SamplerChain  # the chain every backend samples with, and what it reports per token
from engine.sampling import CustomStage, CustomStageError, final_distribution  # your own stage; the row a draw used
from engine.sampling.llamacpp_json import ImportedSettings, llamacpp_json, parse_llamacpp_json
from engine.top_n import TOP_LOGPROBS_MAX  # the most alternatives per token a server gives (OpenAI's ceiling)
from engine.sampling.registry import CONTROLS as SAMPLER_CONTROLS  # each stage setting's control: label, range, tip
from engine.sampling.registry import STAGE_ROWS, switched_on_by, Control as SamplerControl  # every stage's row (engine.sampling.registry)

# The OpenAI-compatible server (engine.serve): its web stack (uvicorn, Starlette) loads only when one of these
# is first asked for, so importing the engine (the window, the CLI) does not pay for it.
from typing import Any as _Any

_SERVE_NAMES = ("ExchangeSink", "RunningServer", "ServeOptions", "ServeSetupError", "ServedExchange", "start_server")


def __getattr__(name: str) -> _Any:
    if name in _SERVE_NAMES:
        from engine import serve

        return getattr(serve, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


__all__ = [
    *_SERVE_NAMES,
    "TOP_LOGPROBS_MAX",
    "atomic_text_file",
    "write_text_atomic",
    "busy_workers",
    "close_all",
    "end_template_renders",
    "CONSTRAINT_KINDS",
    "Constraint",
    "ConstraintError",
    "ConstraintStep",
    "BACKENDS",
    "BACKEND_TABLE",
    "backend_help",
    "user_backends",
    "ChatSession",
    "ContextLengthError",
    "CustomStage",
    "CustomStageError",
    "DEFAULT_ORDER",
    "DEFAULT_SAMPLER",
    "DefaultModelMissingError",
    "Done",
    "Engine",
    "EngineError",
    "GenerationCancelled",
    "GenerationRequest",
    "GenerationStats",
    "Fingerprint",
    "HubUnreachableError",
    "ImportedSettings",
    "LazyTuple",
    "LoomAudit",
    "ModelInfo",
    "ModelLoadError",
    "ModelNotFoundError",
    "RemoteCodeRefusedError",
    "RuntimeFacts",
    "RuntimeSettings",
    "INT32_MAX",
    "Rewind",
    "Pick",
    "SAMPLER_CONTROLS",
    "STAGE_NAMES",
    "STAGE_ROWS",
    "switched_on_by",
    "SamplerControl",
    "SamplerChain",
    "SamplerSettings",
    "ServerInfo",
    "StageSnapshot",
    "TokenEvent",
    "TokenIdError",
    "TokenProb",
    "default_model_path",
    "download_default_model",
    "template_choice",
    "experiments",
    "final_distribution",
    "loom",
    "library",
    "lens",
    "documents",
    "tools",
    "CallConfidence",
    "call_confidence",
    "McpConfigError",
    "McpHub",
    "read_mcp_config",
    "steering",
    "reasoning",
    "custom_code_files",
    "list_server_models",
    "llamacpp_json",
    "load_model",
    "models_dir",
    "parse_llamacpp_json",
    "remember_connection",
    "server_sampler_fields",
    "split_server_credentials",
    "split_server_spec",
]
