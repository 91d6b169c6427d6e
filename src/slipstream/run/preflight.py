"""Checks of a config against this machine before any work starts: a model folder that is
missing or malformed, and an optional library a setting needs but that is not installed, are
a `ConfigError` naming the setting (and the install command), not a traceback minutes in.

Only what is cheap is checked (files, JSON, the tokenizer, whether a package can be found);
the weights themselves are read when the run loads them.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slipstream.config import Config, ConfigError

if TYPE_CHECKING:
    from slipstream.model.llama import ModelConfig

# setting -> (package to find, what to install)
EXTRAS = {"ray": "ray", "tensorboard": "tensorboard", "wandb": "wandb"}
FOLDER = "expected a Hugging Face model folder: config.json, *.safetensors, tokenizer.json"


def preflight(cfg: Config) -> None:
    """Raise `ConfigError` for the first problem found (module docstring)."""
    if cfg.runtime.kind == "ray":
        _need("ray", "runtime.kind = 'ray'")
    for sink in cfg.run.sinks:
        if sink in EXTRAS:
            _need(sink, f"run.sinks includes {sink!r}")
    if cfg.model.path is not None:
        model = check_model_folder(Path(cfg.model.path))
        check_window(cfg, model)


def check_window(cfg: Config, model: ModelConfig) -> None:
    """A sliding window the run's sequences certainly exceed (engine.max_len, else at least
    one prompt token + max_new_tokens) stops here; the engine checks the measured length."""
    from slipstream.model.llama import window_error

    e = cfg.engine
    longest = e.max_len or cfg.sampling.max_new_tokens + 1
    said = f"engine.max_len = {e.max_len}" if e.max_len else "sampling.max_new_tokens + a prompt"
    too_long = window_error(model, min(longest, model.max_position_embeddings), said)
    if too_long:
        raise ConfigError(f"model.path {too_long}")


def importable(name: str) -> bool:
    """Whether `import name` can find the package (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent missing, or `sys.modules[name] = None`
        return False


def _need(package: str, setting: str) -> None:
    if not importable(package):
        raise ConfigError(
            f"{setting}: needs the {package} package, which is not installed; "
            f"pip install 'slipstream[{EXTRAS[package]}]'"
        )


def check_model_folder(path: Path) -> ModelConfig:
    """`model.path` names a folder with a readable config.json, safetensors weights and a
    tokenizer.json; its model config."""
    key = f"model.path: {path}"
    if not path.exists():
        raise ConfigError(f"{key} does not exist ({FOLDER})")
    if not path.is_dir():
        raise ConfigError(f"{key} is a file, not a folder ({FOLDER})")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"{key} has no config.json ({FOLDER})")
    raw = json_object(cfg_file, "a JSON object of model settings")
    from slipstream.model.hf import config_from_dict

    try:
        model = config_from_dict(raw)
    except (TypeError, ValueError, KeyError) as e:
        raise ConfigError(f"{cfg_file}: not a model config slipstream can load ({e})") from None
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()
        except (OSError, UnicodeDecodeError, ValueError, KeyError, AttributeError, TypeError):
            raise ConfigError(f"{index}: not a safetensors index (no 'weight_map')") from None
    elif not any(path.glob("*.safetensors")):
        raise ConfigError(
            f"{key} has no *.safetensors weights (only safetensors are loaded; convert .bin "
            "checkpoints first)"
        )
    if not (path / "tokenizer.json").is_file():
        raise ConfigError(f"{key} has no tokenizer.json ({FOLDER})")
    check_tokenizer_files(path)
    return model


# the JSON files beside tokenizer.json that the tokenizer and the chat template read
TOKENIZER_JSON = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.json",
)


def check_tokenizer_files(path: Path) -> None:
    """tokenizer.json parses as a tokenizer, and each of `TOKENIZER_JSON` present is a JSON
    object: one line naming the file, not a traceback when the run loads them."""
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception as e:  # the Rust parser's own error type
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"{path / 'tokenizer.json'}: not a tokenizer ({first})") from None
    for name in TOKENIZER_JSON:
        f = path / name
        if not f.exists():
            continue
        json_object(f, "a JSON object")


def json_object(f: Path, what: str) -> dict[str, Any]:
    """The JSON object in file `f`; a one-line `ConfigError` naming it if it is not valid JSON
    or not `what` (an object)."""
    try:
        raw = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{f}: not valid JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{f}: expected {what}")
    return raw
