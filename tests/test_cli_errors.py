"""Errors a new user meets are one line naming the setting, exit 2, before any work starts:
a missing or malformed model folder, a missing optional library, an empty override value."""

from __future__ import annotations

import json
import sys

import pytest

from slipstream.cli import main


def _train(capsys, tmp_path, *overrides: str) -> tuple[int, str]:
    run = tmp_path / "run"
    rc = main(["train", f'run.dir="{run}"', "run.steps=1", "run.quiet=true", *overrides])
    err = capsys.readouterr().err.strip()
    assert not run.exists()  # nothing started
    return rc, err


def _one_line(err: str, *parts: str) -> None:
    assert err.startswith("slipstream train: error: ") and "\n" not in err, err
    assert "Traceback" not in err and all(p in err for p in parts), err


def test_a_missing_model_folder(capsys, tmp_path):
    rc, err = _train(capsys, tmp_path, "model.path=/no/such/folder")
    assert rc == 2
    _one_line(err, "model.path", "/no/such/folder", "does not exist")


CONFIG = json.dumps({"model_type": "llama", "vocab_size": 8, "hidden_size": 4})
# Qwen2.5's documented long-context setting: a scaling the decoder does not implement
YARN = json.dumps(
    {"model_type": "qwen2", "rope_scaling": {"type": "yarn", "factor": 4.0}, "hidden_size": 8}
)
# rotary settings that are not an object: a string passed the check and raised AttributeError
# mid-run (rope_scaling), or was silently read as unscaled rope (rope_parameters)
ROPE_STRING = json.dumps({"model_type": "llama", "rope_scaling": "linear", "hidden_size": 8})
ROPE_LIST = json.dumps({"model_type": "llama", "rope_parameters": ["linear"], "hidden_size": 8})


@pytest.mark.parametrize(
    "files, said",
    [
        ({}, "no config.json"),
        ({"config.json": "{not json"}, "not valid JSON"),
        ({"config.json": "[1]"}, "expected a JSON object"),
        ({"config.json": CONFIG}, "no *.safetensors"),
        ({"config.json": CONFIG, "model.safetensors": ""}, "no tokenizer.json"),
        ({"config.json": CONFIG, "model.safetensors.index.json": "{}"}, "safetensors index"),
        ({"config.json": YARN}, "unsupported rope_scaling type 'yarn'"),
        (
            {"config.json": ROPE_STRING},
            'rope_scaling must be a JSON object of rotary settings, got "linear"',
        ),
        (
            {"config.json": ROPE_LIST},
            'rope_parameters must be a JSON object of rotary settings, got ["linear"]',
        ),
    ],
)
def test_a_malformed_model_folder(capsys, tmp_path, files, said):
    d = tmp_path / "model"
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
    rc, err = _train(capsys, tmp_path, f'model.path="{d}"')
    assert rc == 2
    _one_line(err, said)


@pytest.mark.parametrize(
    "package, overrides",
    [
        ("ray", ['runtime.kind="ray"']),
        ("tensorboard", ['run.sinks=["jsonl", "tensorboard"]']),
        ("wandb", ['run.sinks=["wandb"]']),
    ],
)
def test_a_missing_optional_library_names_the_install_command(
    capsys, tmp_path, monkeypatch, package, overrides
):
    monkeypatch.setitem(sys.modules, package, None)  # `import package` fails
    rc, err = _train(capsys, tmp_path, *overrides)
    assert rc == 2
    _one_line(err, package, f"pip install 'slipstream[{package}]'")


def test_a_ray_address_with_no_cluster_there_names_the_setting(capsys, tmp_path, monkeypatch):
    """Before, `runtime.address=auto` with no Ray cluster running was a traceback
    (`ConnectionError: Could not find any running Ray instance`), exit 1, and the advice to
    start again. Ray's discovery is made to find none here, so a cluster another process runs
    on this machine is not joined."""
    ray = pytest.importorskip("ray")
    from ray._private import services

    assert not ray.is_initialized()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "_find_address_from_flag", lambda flag: [])  # no GCS running
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: None)  # nor started
    services.find_gcs_addresses.cache_clear()
    rc, err = _train(capsys, tmp_path, 'runtime.kind="ray"', 'runtime.address="auto"')
    assert rc == 2 and not ray.is_initialized()
    _one_line(err, "runtime.address", "'auto'", "ray start --head", "leave runtime.address unset")


def test_an_empty_value_is_an_error_not_the_default(capsys, tmp_path):
    rc = main(["train", "run.dir=", "run.steps=1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    _one_line(err, "'run.dir='", "empty value")


@pytest.mark.slow
def test_the_cli_makes_openmp_threads_sleep_unless_the_user_chose():
    """`slipstream` sets OMP_WAIT_POLICY=PASSIVE before torch (and its OpenMP runtime) loads,
    and keeps a value the user set: importing the package does not load torch, so the CLI
    module's first lines run first."""
    import os
    import subprocess

    code = (
        "import os, sys; import slipstream; assert 'torch' not in sys.modules; "
        "import slipstream.cli; print(os.environ['OMP_WAIT_POLICY'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    got = [
        subprocess.run(
            [sys.executable, "-c", code], env=e, capture_output=True, text=True, check=True
        ).stdout.strip()
        for e in (env, {**env, "OMP_WAIT_POLICY": "ACTIVE"})
    ]
    assert got == ["PASSIVE", "ACTIVE"]


@pytest.mark.parametrize(
    "name, text, said",
    [
        ("tokenizer_config.json", "{not json", "tokenizer_config.json: not valid JSON"),
        ("generation_config.json", '{"eos_token_id": 1,}', "generation_config.json: not valid"),
        ("special_tokens_map.json", "[]", "special_tokens_map.json: expected a JSON object"),
        ("tokenizer.json", '{"version": "1.0"}', "tokenizer.json: not a tokenizer"),
    ],
)
def test_a_malformed_tokenizer_file_names_the_file(capsys, tmp_path, name, text, said):
    from chat_model import qwen2_tokenizer

    d = qwen2_tokenizer(tmp_path / "model")
    (d / "config.json").write_text(CONFIG)
    (d / "model.safetensors").write_text("")
    (d / name).write_text(text)
    rc, err = _train(capsys, tmp_path, f'model.path="{d}"')
    assert rc == 2
    _one_line(err, said)


def _windowed(tmp_path, **config):
    from chat_model import qwen2_tokenizer

    d = qwen2_tokenizer(tmp_path / "model")
    raw = {"model_type": "qwen2", "vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 2}
    _save(d, {**raw, **config})
    return d


def _save(d, raw: dict) -> None:
    """A model of config `raw` (random weights) saved in `d`: config.json and safetensors."""
    from slipstream.model.hf import config_from_dict, save_pretrained
    from slipstream.model.llama import CausalLM

    save_pretrained(CausalLM(config_from_dict(raw)), d)


# Qwen2's sliding window on layer 1 of 2 (max_window_layers = 1), of 16 tokens
WINDOW = {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}


@pytest.mark.parametrize(
    "config, overrides",
    [
        (WINDOW, ["sampling.max_new_tokens=16"]),  # 16 new + a prompt token exceed 16
        (WINDOW, ["engine.max_len=17", "sampling.max_new_tokens=4"]),
        ({**WINDOW, "max_window_layers": 28, "layer_types": ["full_attention", "sliding_attention"]}, ["sampling.max_new_tokens=16"]),
    ],
)  # fmt: skip
def test_a_sliding_window_the_run_exceeds_is_an_error(capsys, tmp_path, config, overrides):
    d = _windowed(tmp_path, **config)
    rc, err = _train(capsys, tmp_path, f'model.path="{d}"', *overrides)
    assert rc == 2
    _one_line(
        err, "config.json: use_sliding_window with sliding_window = 16", "engine.max_len <= 16"
    )


@pytest.mark.parametrize(
    "config",
    [
        {**WINDOW, "use_sliding_window": False},
        {**WINDOW, "max_window_layers": 2},  # no layer is windowed
        {**WINDOW, "sliding_window": 4096},
    ],
)
def test_a_sliding_window_that_cannot_matter_passes_the_check(tmp_path, config):
    from slipstream.config import load_config
    from slipstream.run.preflight import preflight

    d = _windowed(tmp_path, **config)
    preflight(load_config(None, [f'model.path="{d}"', "sampling.max_new_tokens=16"]))


def test_the_engine_checks_the_measured_length_against_the_window(tmp_path):
    from slipstream.config import ConfigError, load_config
    from slipstream.model.hf import config_from_dict
    from slipstream.model.llama import CausalLM
    from slipstream.run.components import engine_shape, resolve_placement

    raw = {"model_type": "qwen2", "vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 2}
    model = CausalLM(config_from_dict({**raw, **WINDOW, "num_attention_heads": 2}))
    cfg = load_config(None, ["sampling.max_new_tokens=8"])
    where = resolve_placement(cfg)
    assert engine_shape(cfg, where, model, [8], 2)[1] == 16  # 8 + 8 fits the window
    with pytest.raises(ConfigError, match="sequences reach 17 tokens"):
        engine_shape(cfg, where, model, [9], 2)
    # an episode's context sets the engine's length: it was not checked against the window
    said = r"reach 40 tokens \(an episode's context.*: lower env\.max_tokens$"
    with pytest.raises(ConfigError, match=said):
        engine_shape(cfg, where, model, [8], 2, context=40)


TINY_QWEN = {"model_type": "qwen2", "vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 8}  # fmt: skip


def _sharded(tmp_path):
    from chat_model import qwen2_tokenizer
    from slipstream.model.hf import config_from_dict, save_pretrained
    from slipstream.model.llama import CausalLM

    d = qwen2_tokenizer(tmp_path / "model")
    save_pretrained(CausalLM(config_from_dict(TINY_QWEN)), d, max_shard_bytes=600)
    return d


def test_a_model_folder_whose_weights_cannot_load_is_refused_before_any_work(capsys, tmp_path):
    """The check read the index only: a missing or truncated shard, or a config.json whose
    sizes are not the weights', ended mid-run in a traceback, exit 1."""
    d = _sharded(tmp_path)
    shards = sorted(d.glob("model-*.safetensors"))
    assert len(shards) > 2
    from slipstream.config import load_config
    from slipstream.run.preflight import preflight

    preflight(load_config(None, [f'model.path="{d}"']))  # whole, it passes
    data = shards[1].read_bytes()
    shards[1].write_bytes(data[: len(data) // 2])
    rc, err = _train(capsys, tmp_path, f'model.path="{d}"')
    assert rc == 2
    _one_line(err, shards[1].name, "not a readable safetensors file")
    assert err.count(str(d)) == 1, err  # the folder named once (was `{d}: {d}/...`)
    shards[1].unlink()
    rc, err = _train(capsys, tmp_path, f'model.path="{d}"')
    _one_line(err, shards[1].name, "named by model.safetensors.index.json, but missing")
    assert err.startswith(f"slipstream train: error: model.path: {d}: {shards[1].name}: "), err
    d = _sharded(tmp_path / "again")
    (d / "config.json").write_text(json.dumps({**TINY_QWEN, "intermediate_size": 16}))
    rc, err = _train(capsys, tmp_path, f'model.path="{d}"')
    assert rc == 2
    _one_line(err, "mlp.", "[8, 8] in the weights but [16, 8] by config.json")
    assert err.startswith(f"slipstream train: error: model.path: {d}: model.layers.0."), err


@pytest.mark.parametrize(
    "change, said",
    [
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        (
            {"quantization_config": {"quant_method": "gptq", "bits": 4}},
            "quantized checkpoints are not supported (quantization_config: 'gptq')",
        ),
        ({"num_key_value_heads": 0}, "num_key_value_heads must be a positive integer, got 0"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5 is not supported (only 1.0"),
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                              "high_freq_factor": 1.0}},
            "llama3 scaling needs high_freq_factor > low_freq_factor, got high_freq_factor = 1.0",
        ),
    ],
)  # fmt: skip
def test_a_config_this_decoder_would_compute_wrongly_is_refused(capsys, tmp_path, change, said):
    """A gelu MLP loaded as SwiGLU (logits silently wrong); a quantized checkpoint (its
    weights failed the tensor check with a vague message); zero KV heads divided by zero; a
    partial rotary head loaded as a whole one; a llama3 scaling with no smoothing band."""
    d = _sharded(tmp_path)
    (d / "config.json").write_text(json.dumps({**TINY_QWEN, **change}))
    rc, err = _train(capsys, tmp_path, f'model.path="{d}"')
    assert rc == 2
    _one_line(err, said)


def test_a_sliding_window_left_out_is_transformers_default_4096():
    from slipstream.model.hf import config_from_dict
    from slipstream.model.llama import window_error

    cfg = config_from_dict({**TINY_QWEN, "use_sliding_window": True, "max_window_layers": 0})
    assert window_error(cfg, 4096, "x") is None
    assert "sliding_window = 4096" in (window_error(cfg, 4097, "x") or "")


def test_a_llama_config_s_window_settings_are_none_as_in_transformers():
    """transformers' Llama has no sliding attention: `use_sliding_window` in a Llama
    config.json changes nothing there, so it must not refuse long sequences here."""
    from slipstream.model.hf import config_from_dict
    from slipstream.model.llama import window_error

    raw = {**TINY_QWEN, "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0}
    assert window_error(config_from_dict({**raw, "model_type": "llama"}), 4096, "x") is None
    assert "sliding_window = 16" in (window_error(config_from_dict(raw), 4096, "x") or "")


def test_a_tokenizer_that_cannot_tell_its_end_token_is_refused_before_any_work(capsys, tmp_path):
    d = _sharded(tmp_path)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "eos_token": None}))
    for name in ("generation_config.json", "special_tokens_map.json"):
        (d / name).unlink(missing_ok=True)
    rc, err = _train(capsys, tmp_path, f'model.path="{d}"')
    assert rc == 2
    _one_line(err, "model.path", "end-of-sequence")


@pytest.mark.parametrize(
    "override, key",
    [
        ("task.path=nope.parquet", "task.path"),
        ("task.heldout_path=nope.jsonl", "task.heldout_path"),
        ('eval.sets={x="nope.jsonl"}', "eval.sets.x"),
    ],
)
def test_a_dataset_path_that_does_not_exist_names_its_setting(capsys, tmp_path, override, key):
    """It said only `nope.jsonl: no such file or folder`, after the run folder was made."""
    rc, err = _train(capsys, tmp_path, override)
    assert rc == 2
    _one_line(err, f"{key}: nope.", "does not exist")


def test_the_readmes_chat_model_script_without_its_folder_says_its_usage():
    """`python tests/chat_model.py` (as the README once showed it) raised IndexError."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).parent / "chat_model.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == (
        "usage: python tests/chat_model.py OUT  (writes OUT/model, OUT/train.parquet, "
        "OUT/rewards.py)"
    )


@pytest.fixture
def ray_init(monkeypatch) -> list[object]:
    """`ray.init` stubbed: the addresses a run tried to join (none, if preflight stopped it)."""
    ray = pytest.importorskip("ray")
    calls: list[object] = []

    def init(*args: object, **kwargs: object) -> None:
        calls.append(kwargs.get("address"))
        raise RuntimeError("ray.init reached")

    monkeypatch.setattr(ray, "init", init)
    return calls


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "address, said",
    [
        ("nonsense", "is not a Ray cluster address (expected auto, HOST:PORT"),
        ("10.0.0.1:notaport", "is not a Ray cluster address"),
        ("http://127.0.0.1:6379", "is not a Ray cluster address"),
        ("127.0.0.1:CLOSED", "no Ray cluster at '127.0.0.1:CLOSED' (cannot connect to 127"),
        ("ray://127.0.0.1:CLOSED", "'ray://127.0.0.1:CLOSED' (cannot connect to 127.0.0.1:"),
    ],
)
def test_a_malformed_or_unreachable_ray_address_names_the_setting(
    capsys, tmp_path, ray_init, address, said
):
    """A malformed `runtime.address` was Ray's ValueError, a traceback and exit 1; one where
    nothing answers made `ray.init` wait minutes (measured here: killed after 60 s on
    127.0.0.1:1). Now preflight says either in one line, exit 2, and Ray is never started."""
    port = str(_closed_port())
    address, said = address.replace("CLOSED", port), said.replace("CLOSED", port)
    rc, err = _train(capsys, tmp_path, 'runtime.kind="ray"', f'runtime.address="{address}"')
    assert (rc, ray_init) == (2, [])
    _one_line(err, "runtime.address", said)


def test_a_ray_address_probe_is_bounded_and_knows_a_gcs(monkeypatch):
    """A server that accepts the connection but never answers is refused after the probe's
    timeout; one that is not a Ray GCS (another gRPC service) is refused at once; a GCS that
    gives its cluster id passes."""
    import socket
    import time
    from concurrent import futures

    grpc = pytest.importorskip("grpc")
    pytest.importorskip("ray")
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    from slipstream.config import ConfigError
    from slipstream.run.preflight import check_ray_address

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match=r"no answer from 127\.0\.0\.1:\d+ in 0\.5 s"):
            check_ray_address(f"127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.5)
        assert time.monotonic() - t0 < 3

    class Gcs(gcs_service_pb2_grpc.NodeInfoGcsServiceServicer):
        def GetClusterId(self, request, context):
            return gcs_service_pb2.GetClusterIdReply()

    for servicer, ok in ((None, False), (Gcs(), True)):
        server = grpc.server(futures.ThreadPoolExecutor(1))
        if servicer is not None:
            gcs_service_pb2_grpc.add_NodeInfoGcsServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            if ok:
                check_ray_address(f"127.0.0.1:{port}", timeout_s=5)
                check_ray_address(f"ray://127.0.0.1:{port}", timeout_s=5)
            else:
                with pytest.raises(ConfigError, match="is not a Ray head's GCS"):
                    check_ray_address(f"127.0.0.1:{port}", timeout_s=5)
                check_ray_address(f"ray://127.0.0.1:{port}", timeout_s=5)  # a Ray Client server
        finally:
            server.stop(None)
