"""Checks of a config against this machine before any work starts: a model folder that is
missing or malformed, an optional library a setting needs but that is not installed, a
`run.dir` that cannot be made or already holds another run, and a Ray cluster address that is
malformed or where nothing answers, are a `ConfigError` naming the setting (and the install
command), not a traceback minutes in.

Only what is cheap is checked (files, JSON, the tokenizer, the weights' safetensors headers,
whether a package can be found, whether a dataset path exists, one call to a Ray cluster); the
weights themselves are read when the run loads them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slipstream.config import Config, ConfigError
from slipstream.text import first_line

if TYPE_CHECKING:
    from slipstream.model.llama import ModelConfig

# setting -> (package to find, what to install)
EXTRAS = {"ray": "ray", "tensorboard": "tensorboard", "wandb": "wandb"}
FOLDER = "expected a Hugging Face model folder: config.json, *.safetensors, tokenizer.json"
# `runtime.address` to join: HOST:PORT (the head's GCS) or ray://HOST:PORT (Ray Client); an
# IPv6 host in brackets
RAY_ADDRESS = re.compile(r"(?:ray://)?(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]@]+):([0-9]{1,5})")
RAY_PROBE_S = 5.0  # the longest wait for a TCP connection to `runtime.address`


def preflight(cfg: Config, resume: bool = False) -> None:
    """Raise `ConfigError` for the first problem found (module docstring); `resume`: the run
    continues the one in `run.dir` (`slipstream train --resume`)."""
    check_run_dir(cfg.run.dir, resume)
    if cfg.runtime.kind == "ray":
        _need("ray", "runtime.kind = 'ray'")
    for sink in cfg.run.sinks:
        if sink in EXTRAS:
            _need(sink, f"run.sinks includes {sink!r}")
    if cfg.model.path is not None:
        model = check_model_folder(Path(cfg.model.path))
        check_window(cfg, model)
    check_data_paths(cfg)
    if cfg.runtime.kind == "ray":  # last: the one check that can wait (`RAY_PROBE_S`)
        check_ray_address(cfg.runtime.address)


def check_ray_address(address: str | None, timeout_s: float = RAY_PROBE_S) -> None:
    """`runtime.address` is unset (a private Ray), `auto` or `local` (Ray's own discovery:
    `runtime.ray.session` names the setting when it finds none), or `[ray://]HOST:PORT` where
    a server answers, within `timeout_s`, the call for the cluster id that `ray.init` makes
    first: a Ray head's GCS at `HOST:PORT`; any gRPC server at `ray://` (a Ray Client server
    does not serve that call). Ray itself takes a malformed address for a traceback, and
    waits minutes on one where nothing answers."""
    if address is None or address in ("auto", "local"):
        return
    host, port = ray_host_port(address)
    try:  # Ray's generated service code (checked on ray 2.60 against a `ray start --head`)
        import grpc  # type: ignore[import-untyped]  # (installed with ray)
        from ray.core.generated.gcs_service_pb2 import (  # type: ignore[attr-defined]
            GetClusterIdRequest,
        )
        from ray.core.generated.gcs_service_pb2_grpc import NodeInfoGcsServiceStub
    except (ImportError, AttributeError):  # another Ray's layout: `ray.init` says what it finds
        return

    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    with grpc.insecure_channel(target) as ch:
        try:
            NodeInfoGcsServiceStub(ch).GetClusterId(GetClusterIdRequest(), timeout=timeout_s)
            return
        except grpc.RpcError as e:
            code = e.code() if isinstance(e, grpc.Call) else None
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        why = f"no answer from {target} in {timeout_s:g} s"
    elif code == grpc.StatusCode.UNAVAILABLE:
        why = f"cannot connect to {target}"
    elif code == grpc.StatusCode.UNIMPLEMENTED and not address.startswith("ray://"):
        why = f"what answers at {target} is not a Ray head's GCS"
    else:  # the server answered (a Ray Client server serves no GCS calls); `ray.init` goes on
        return
    raise ConfigError(
        f"runtime.address: no Ray cluster at {address!r} ({why}); start one there with "
        "`ray start --head`, or leave runtime.address unset for a private Ray on this machine"
    )


def ray_host_port(address: str) -> tuple[str, int]:
    """The host and port of a Ray address `[ray://]HOST:PORT` (`RAY_ADDRESS`); a `ConfigError`
    naming `runtime.address` for anything else."""
    m = RAY_ADDRESS.fullmatch(address)
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise ConfigError(
            f"runtime.address: {address!r} is not a Ray cluster address (expected auto, "
            "HOST:PORT such as 10.0.0.5:6379, or ray://HOST:PORT for Ray Client)"
        )
    return m.group(1).strip("[]"), int(m.group(2))


def check_data_paths(cfg: Config) -> None:
    """Each dataset a setting names is a file or folder here, or a hub id (`owner/name`,
    loaded later where the network allows): a path that is neither names its setting."""
    from slipstream.tasks.datasets import looks_like_hub_id

    t = cfg.task
    named = [("task.path", t.path), ("task.heldout_path", t.heldout_path)]
    named += [(f"eval.sets.{k}", v) for k, v in cfg.eval.sets.items()]
    for key, path in named:
        if path is not None and not Path(path).exists() and not looks_like_hub_id(path):
            raise ConfigError(f"{key}: {path} does not exist (a file, a folder or a hub id)")


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


def held_run(folder: Path) -> str | None:
    """What in `folder` shows it holds a run (`metrics.jsonl`, `checkpoints/`); None if nothing."""
    for name in ("metrics.jsonl", "checkpoints"):
        if (folder / name).exists():
            return name + ("/" if name == "checkpoints" else "")
    return None


def check_run_dir(run_dir: str | None, resume: bool = False) -> None:
    """`run.dir` is a folder this process can make and write in (None: `runs/<UTC time>`);
    without `resume`, one that holds no run already: a second run's records would be appended
    to the first's, and checkpoint pruning would mix their checkpoints."""
    path = Path(run_dir or "runs")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"run.dir: {path} is a file, not a folder")
    there = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not there.is_dir():
        raise ConfigError(f"run.dir: {path} cannot be made ({there} is not a folder)")
    if not os.access(there, os.W_OK | os.X_OK):
        raise ConfigError(f"run.dir: {path} cannot be made or written ({there}: permission denied)")
    held = held_run(path) if run_dir is not None and path.is_dir() else None
    if held is not None and not resume:
        raise ConfigError(
            f"run.dir: {path} already holds a run ({held}); continue it with "
            f"slipstream train --resume {path}, or give another run.dir"
        )


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
    from slipstream.model.hf import check_weights
    from slipstream.model.tokenizer import load_tokenizer

    try:
        check_weights(path, model)
        load_tokenizer(path)
    except (ValueError, KeyError, OSError) as e:  # named once: `key` names the folder
        said = first_line(e).removeprefix(f"{path}: ").removeprefix(f"{path}{os.sep}")
        raise ConfigError(f"{key}: {said}") from None
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
