"""Model folders that ship their own Python code (`auto_map`): named, and refused unless the user allows them.

transformers refuses such a folder with its own message, which tells the
user to pass `trust_remote_code=True` in Python and links to a broken
`https://hf.co//path`. We say it in our words before transformers is asked:
which files would run, and how to allow it. A folder whose `auto_map` points
at an architecture transformers implements itself loads with the library's
code (transformers prefers it), so it is not refused.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from engine.errors import RemoteCodeRefusedError

log = logging.getLogger(__name__)

# Files whose `auto_map` names classes transformers would import from the folder.
_CONFIG_FILES = ("config.json", "tokenizer_config.json", "processor_config.json")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # a missing or unreadable file is reported by the loader itself, with its own message
    return data if isinstance(data, dict) else {}


def _code_refs(auto_map: dict) -> list[str]:
    """"modeling_x.Cls", "org/repo--modeling_x.Cls" or [slow, fast] lists -> the references, in order."""
    refs: list[str] = []
    for value in auto_map.values():
        for ref in value if isinstance(value, list) else [value]:
            if isinstance(ref, str) and "." in ref:
                refs.append(ref)
    return refs


def _file_of(ref: str) -> str:
    repo, sep, module_ref = ref.rpartition("--")
    module = module_ref.rsplit(".", 1)[0].replace(".", "/") + ".py"
    return f"{module} from {repo}" if sep else module


def custom_code_files(folder: Path) -> tuple[str, ...]:
    """The Python files `folder`'s configs ask to import (`auto_map`), e.g. ("modeling_phi.py", ...)."""
    files: list[str] = []
    for name in _CONFIG_FILES:
        auto_map = _read_json(Path(folder) / name).get("auto_map")
        if isinstance(auto_map, dict):
            files += [_file_of(ref) for ref in _code_refs(auto_map)]
    return tuple(dict.fromkeys(files))


def _library_implements(folder: Path) -> bool:
    """True when transformers has its own code for the folder's model type (then no folder code runs)."""
    model_type = _read_json(Path(folder) / "config.json").get("model_type")
    if not isinstance(model_type, str):
        return False
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return model_type in CONFIG_MAPPING_NAMES


def needs_remote_code(folder: Path) -> tuple[str, ...]:
    """The code files loading `folder` would run; () when none (no auto_map, or the library's own code is used)."""
    files = custom_code_files(folder)
    if files and _library_implements(folder):
        return ()  # transformers prefers its own code; if it still wants the folder's, `refusal` words its error
    return files


def is_remote_code_error(error: BaseException) -> bool:
    """transformers' own refusal (a ValueError asking for `trust_remote_code=True`)."""
    return isinstance(error, ValueError) and "trust_remote_code" in str(error)


def refusal(folder: Path, files: tuple[str, ...] = ()) -> RemoteCodeRefusedError:
    files = files or custom_code_files(folder)
    return RemoteCodeRefusedError(
        f"{Path(folder).name} ships its own Python code, which would run with your user's rights: "
        f"{', '.join(files) or 'the .py files'} (in {folder}). Read it first; to allow it, pass --trust-remote-code "
        f"(command line) or confirm in the app's Open model dialog",
        files,
    )


def refuse_unless_trusted(folder: Path, trust_remote_code: bool) -> None:
    """RemoteCodeRefusedError naming the files, unless running them was allowed (then it is logged)."""
    files = needs_remote_code(folder)
    if not files:
        return
    if trust_remote_code:
        log.warning("running model code from %s: %s (allowed by trust_remote_code)", folder, ", ".join(files))
        return
    raise refusal(folder, files)
