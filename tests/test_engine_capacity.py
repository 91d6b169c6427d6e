"""The engine's KV cache sized from memory; prompts it cannot hold skipped and counted."""

from __future__ import annotations

import pytest
import torch

from slipstream.engine import capacity
from slipstream.engine.forward import DecodeGraph, SlotKV, span_buckets
from slipstream.engine.packed import PackedWeights
from slipstream.engine.sampling import sample_static
from slipstream.model.hf import tensor_bytes
from slipstream.model.llama import CausalLM, ModelConfig
from slipstream.types import Prompt

# Qwen2.5-1.5B: 28 layers, 2 KV heads of 128
QWEN_1_5B = ModelConfig(
    model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
    num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
)  # fmt: skip


def test_kv_bytes_per_token_golden():
    # 2 (k, v) x 28 layers x 2 heads x 128 dims x 2 bytes = 28,672
    assert capacity.kv_bytes_per_token(QWEN_1_5B, torch.bfloat16) == 28672
    assert capacity.kv_bytes_per_token(QWEN_1_5B, torch.float32) == 2 * 28672


def test_cache_budget_from_tokens_or_memory():
    # max_tokens: 5000 tokens hold 5000 // 1000 - 1 = 4 slots of 1000 beside the scratch row
    assert capacity.engine_slots(QWEN_1_5B, torch.bfloat16, 8, 1000, max_tokens=5000) == 4
    # half of (10 GiB less the packed weights' 3,087,253,504 B) over 28,672 B a token:
    # (10,737,418,240 - 3,087,253,504) / 2 / 28,672 = 133,408.4 -> 133,408
    packed = capacity.packed_bytes(QWEN_1_5B, torch.bfloat16)
    assert capacity.memory_budget(10 * 2**30, 0.5, packed) // 28672 == 133408
    # the packed copy alone fills the free memory: no bytes (engine_slots refuses it)
    assert capacity.memory_budget(3 * 10**9, 0.9, packed) == 0
    # a sampler process also sets aside its staging copy of the weights: 1 GiB less room,
    # (7,650,164,736 - 1,073,741,824) / 2 / 28,672 = 114,683.3 -> 114,683
    assert capacity.memory_budget(10 * 2**30, 0.5, packed + 2**30) // 28672 == 114683
    assert tensor_bytes([torch.zeros(3, 4), torch.zeros(5, dtype=torch.bfloat16)]) == 58
    # no bound: the slots asked for (on a CPU, no free memory; no fraction)
    assert capacity.engine_slots(QWEN_1_5B, torch.bfloat16, 8, 1000, 0, 0.5, None) == 8
    assert capacity.engine_slots(QWEN_1_5B, torch.bfloat16, 8, 1000, 0, 0.0, 10**12) == 8
    with pytest.raises(ValueError, match="cannot hold one sequence of 4096 tokens"):
        capacity.engine_slots(QWEN_1_5B, torch.bfloat16, 8, 4096, 0, 0.9, 3 * 10**9)


def test_graph_outputs_golden():
    """Per span bucket, the decode graph's logits [slots, vocab] and the sampling graph's
    tokens (8 B) and log-probs (4 B) per slot."""
    # 256 x (151,936 x 2 + 8 + 4) = 256 x 303,884 = 77,794,304 B a bucket in bfloat16
    assert capacity.graph_bytes(256, 151936, torch.bfloat16, 1) == 77_794_304
    # float32 (the in-process engine): 256 x (151,936 x 4 + 12) = 155,585,536
    assert capacity.graph_bytes(256, 151936, torch.float32, 1) == 155_585_536
    # max_len 4096 has nine buckets, 16 ... 4096: 9 x 77,794,304 = 700,148,736
    assert span_buckets(4096) == [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    assert capacity.graph_bytes(256, 151936, torch.bfloat16, 9) == 700_148_736
    assert capacity.graph_bytes(256, 151936, torch.bfloat16, 0) == 0


def test_the_memory_budget_pays_for_the_graph_outputs():
    """Qwen2.5-1.5B in bfloat16 at 0.9 of 20 GiB free, max_len 4096. Before, the whole budget
    went to the KV cache (139 slots) and the graphs' outputs, 380 MB at 139 slots, came on
    top of it, so a fraction close to 1 ran out of memory when the graphs were captured."""
    # budget: int(0.9 x (21,474,836,480 - 3,087,253,504)) = 16,548,824,678 B
    # a cache row: 4096 x 28,672 = 117,440,512 B; a slot's graph outputs: 9 x 303,884 =
    # 2,734,956 B. Cache only: (16,548,824,678 - 117,440,512) // 117,440,512 = 139 slots;
    # with the graphs: 16,431,384,166 // (117,440,512 + 2,734,956) = 136 slots
    free, bf16 = 20 * 2**30, torch.bfloat16
    assert capacity.engine_slots(QWEN_1_5B, bf16, 256, 4096, 0, 0.9, free, graphs=False) == 139
    slots = capacity.engine_slots(QWEN_1_5B, bf16, 256, 4096, 0, 0.9, free, graphs=True)
    assert slots == 136
    budget = capacity.memory_budget(free, 0.9, capacity.packed_bytes(QWEN_1_5B, bf16))
    taken = (slots + 1) * 4096 * 28672 + capacity.graph_bytes(slots, 151936, bf16, 9)
    assert taken == 16_461_304_160 <= budget  # 87 MB to spare
    # 139 slots and their graph outputs: 140 x 117,440,512 + 139 x 2,734,956 > the budget
    assert 140 * 4096 * 28672 + capacity.graph_bytes(139, 151936, bf16, 9) > budget


def test_graph_output_bytes_are_what_the_decode_step_keeps():
    """A consistency check of `graph_bytes` against the buffers themselves: the logits a
    fixed-shape decode step returns for each bucket (what its graph keeps) and the tokens and
    log-probs sampling them returns (what the sampling graph keeps), on the CPU path."""
    cfg = ModelConfig(
        vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    slots, max_len = 3, 40
    model = CausalLM(cfg)
    dev = model.lm_head.weight.device
    cache = SlotKV(cfg, slots, max_len, torch.float32, dev)
    last, pos, live = (torch.zeros(slots, dtype=torch.long) for _ in range(3))
    step = DecodeGraph(PackedWeights(model, max_len), cache, last, pos, live, capture=False)
    held = 0
    for b in step.buckets:
        logits = step(b)
        out = sample_static(logits, torch.ones(slots), torch.zeros(slots, dtype=torch.long), pos)
        held += tensor_bytes((logits, out.tokens, out.logp))
    assert step.buckets == span_buckets(max_len) == [16, 32, 40]
    assert held == capacity.graph_bytes(slots, cfg.vocab_size, torch.float32, 3)


def test_packed_bytes_golden():
    # bf16: 2 x (1536 x 151936 head + 28 x (1536 x 2048 qkv + 2048 bias + 1536 x 1536 o
    #            + 3 x 1536 x 8960 gate/up/down)) = 2 x 1,543,626,752
    assert capacity.packed_bytes(QWEN_1_5B, torch.bfloat16) == 3_087_253_504


@pytest.mark.parametrize(
    "kind, extra",
    [
        ("llama", {}),
        ("llama", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}),
        ("qwen2", {}),
        ("qwen3", {"attention_bias": True}),
    ],
)
def test_packed_bytes_are_what_the_engine_packs(kind: str, extra: dict[str, bool]):
    """The bytes the cache's budget sets aside are those `PackedWeights` allocates."""
    cfg = ModelConfig(
        model_type=kind, vocab_size=40, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, **extra,
    )  # fmt: skip
    w = PackedWeights(CausalLM(cfg), max_len=8)
    mats = [w.lm_head] + [t for layer in w.layers for t in layer if isinstance(t, torch.Tensor)]
    held = tensor_bytes(mats)
    assert capacity.packed_bytes(cfg, torch.float32) == held


def test_slots_are_what_the_budget_holds():
    """The cache has a scratch row of `max_len` beside its slots (engine.forward.SlotKV): the
    budget pays for it too, so the cache never takes more tokens than it was given."""
    assert capacity.fit_slots(256, 4096, None) == 256  # no bound
    assert capacity.fit_slots(256, 4096, 187245) == 44  # 187245 // 4096 = 45 rows, 1 scratch
    assert capacity.fit_slots(8, 4096, 187245) == 8  # never more than asked
    assert capacity.fit_slots(8, 4096, 2 * 4096) == 1
    for budget in (4000, 2 * 4096 - 1):
        with pytest.raises(ValueError, match="cannot hold one sequence of 4096"):
            capacity.fit_slots(8, 4096, budget)


def test_the_cache_an_engine_allocates_stays_within_the_budget():
    cfg = ModelConfig(
        vocab_size=13, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    budget, max_len = 100, 24
    kv = SlotKV(cfg, capacity.fit_slots(8, max_len, budget), max_len, torch.float32, "cpu")
    held = tensor_bytes(kv.k + kv.v)
    assert held <= budget * capacity.kv_bytes_per_token(cfg, torch.float32)


def test_max_len_capped_by_setting_and_positions():
    assert capacity.engine_max_len(100, 64, QWEN_1_5B) == 164
    assert capacity.engine_max_len(100, 64, QWEN_1_5B, cap=128) == 128
    small = ModelConfig(max_position_embeddings=96)
    assert capacity.engine_max_len(100, 64, small) == 96
    assert capacity.fits(64, 64, 128) and not capacity.fits(65, 64, 128)


def test_prompts_too_long_for_the_engine_are_skipped_and_counted():
    from test_algo_integration import MIXED, _prompt, _run

    long = Prompt("long" * 10, "x" * 40 + "=", "1", {"outs": MIXED})
    run = _run([_prompt("a", *MIXED), long, _prompt("b", *MIXED)], "sampling.max_new_tokens=8")
    run.max_len = 16  # "a=" + 8 fits; 41 + 8 does not
    drawn = run.draw(4)
    assert [d.prompt.id for d in drawn] == ["a", "b", "a", "b"]
    assert run.prompts_skipped["too_long"] == 2 and run.counters["prompts/skipped_too_long"] == 2


def _counting_run():
    """A run over prompts a, long, b (cycled) whose tokenizer counts `encode_prompt` calls;
    `long` does not fit its engine (16 tokens with a completion of 8)."""
    from test_algo_integration import MIXED, CharTok, _prompt, _run

    class Counting(CharTok):
        calls = 0

        def encode_prompt(self, prompt: Prompt) -> list[int]:
            self.calls += 1
            return super().encode_prompt(prompt)

    long = Prompt("long", "x" * 40 + "=", "1", {"outs": MIXED})
    run = _run([_prompt("a", *MIXED), long, _prompt("b", *MIXED)], "sampling.max_new_tokens=8")
    run.tok, run.max_len = Counting(), 16
    return run


def _want_seeds(seed: int, draws: range, group_size: int) -> list[int]:
    """The seeds of members 0..G-1 of draws `draws` as the loop has always given them."""
    return [(seed * 1_000_003 + k * 4099) % 2**31 + g for k in draws for g in range(group_size)]


def test_a_drawn_prompt_is_encoded_once_per_step():
    """`Run.fits` encoded each drawn prompt to measure it, and `Run.requests` encoded it again
    to generate: 2 encodings of each of the B prompts a step (a chat-rendered prompt of
    thousands of tokens with a real tokenizer). Now the ids that measured it are the ones
    generated from: 6 encodings a step here (4 prompts, 2 too long), 10 before. The requests
    are the same: the ids of encoding each prompt anew, the seeds of the draw counter."""
    from test_algo_integration import CharTok

    run = _counting_run()
    for _ in range(3):
        run.collect(4)
    assert run.tok.calls == 3 * 6
    reqs = run.engine.requests
    assert [r.key[0].id for r in reqs[::4]] == ["a", "b"] * 6
    assert all(r.prompt_tokens == CharTok().encode_prompt(r.key[0]) for r in reqs)
    assert [r.seed for r in reqs] == _want_seeds(run.cfg.run.seed, range(1, 13), 4)


def test_the_orchestrators_draw_and_seeds_encode_a_prompt_once():
    """An orchestrated run's trainer encoded each prompt twice (to measure it when drawn, and
    again to build requests only their seeds were taken from); its samplers encode the
    prompts they are sent. Now once, when drawn, with the same seeds."""
    from slipstream.run.learner import RunLearner

    run = _counting_run()
    learner = RunLearner(run)
    prompts = learner.draw(4)
    seeds = [s for p in prompts for s in learner.seeds(p, 5)]
    assert [p.id for p in prompts] == ["a", "b", "a", "b"] and run.tok.calls == 6
    assert seeds == _want_seeds(run.cfg.run.seed, range(1, 5), 5)


class _Echo:
    """An eval engine that answers '1' to every request, refusing any longer than `max_len`
    with the engine's own error."""

    def __init__(self, max_len: int) -> None:
        from slipstream.engine.stats import EngineStats

        self.max_len, self.stats, self.prompts = max_len, EngineStats(), []
        self.version = 0  # the policy version it holds, as an Engine's

    def generate(self, requests):
        from slipstream.engine import Completion
        from slipstream.types import FinishReason

        out = []
        for r in requests:
            n = len(r.prompt_tokens) + r.params.max_new_tokens
            if n > self.max_len:
                raise ValueError(f"prompt + max_new_tokens = {n} exceeds engine max_len")
            self.prompts.append("".join(map(chr, r.prompt_tokens)))
            out.append(Completion(r, [ord("1")], [0.0], [0], FinishReason.STOP, 0.0, 0.0))
        return out


def test_held_out_prompts_too_long_for_the_engine_are_skipped_and_counted():
    """An evaluation skips what training skips (`Run.fits`) and counts it; its metrics are
    over the prompts evaluated. Before, the engine raised mid-run on the long prompt."""
    from test_algo_integration import _prompt, _run

    long = Prompt("long", "x" * 40 + "=", "1")
    run = _run([_prompt("a")], "sampling.max_new_tokens=8")
    run.max_len, run.eval_engine = 16, _Echo(16)
    run.heldout = [_prompt("a"), long, _prompt("b")]
    run.eval_sets = {"hard": [long, _prompt("c")]}
    assert run.evaluate() == 1.0  # 2 of 2 evaluated
    assert run.eval_metrics["heldout/skipped_too_long"] == 1
    assert run.eval_metrics["heldout/hard/skipped_too_long"] == 1
    assert run.eval_metrics["heldout/hard/mean@1"] == 1.0
    assert run.eval_engine.prompts == ["a=", "b=", "c="]


def test_a_set_none_of_whose_prompts_fits_is_refused_before_the_run():
    from slipstream.config import ConfigError
    from slipstream.run.components import check_too_long

    with pytest.warns(
        RuntimeWarning, match=r"1 of 2 held-out prompts .*\(heldout/skipped_too_long\)"
    ):
        check_too_long({"training": [4, 20], "held-out": [4, 20]}, 8, 16)
    with pytest.warns(RuntimeWarning, match="heldout/gsm/skipped_too_long"):
        check_too_long({"eval.sets.gsm": [4, 20]}, 8, 16)
    for name in ("held-out", "eval.sets.gsm", "training"):
        with pytest.raises(ConfigError) as err:
            check_too_long({name: [9, 20]}, 8, 16)
        assert str(err.value) == (
            f"engine.max_len: 16 tokens hold no {name} prompt with "
            "sampling.max_new_tokens = 8 (shortest: 9 tokens)"
        )


def test_an_episode_runs_engine_fits_its_slots_to_the_episode_context(tmp_path):
    """With environment tools the engine's `max_len` is an episode's context (longer than a
    prompt plus one completion); its slots were fitted to the shorter single-turn length, so
    the in-process engine's cache took more than `engine.max_tokens` (4352 tokens of 2000)."""
    from slipstream.run.setup import setup
    from tiny import tiny_cfg

    over = ("engine.max_tokens=2000", "task.kind=builtin_tools", "warmstart.max_steps=1")
    run = setup(tiny_cfg(tmp_path, "tools", *over, steps=1))
    e = run.engine
    assert e.max_len > 104  # the single-turn length of the built-in task here
    assert (e.num_slots + 1) * e.max_len <= 2000
    assert e.cache.k[0].shape[0] * e.max_len <= 2000  # slots + the scratch row


def test_the_in_process_engine_is_sized_in_its_model_s_dtype(monkeypatch):
    """A bfloat16 run's in-process engine shares the trainer's float32 master weights, so its
    KV cache and packed copies are float32: sized at bfloat16's 2 bytes an entry (what
    `model.dtype` names), its slots took about twice `memory_fraction` of a GPU's free
    memory. Free memory is what a GPU would report; the sizing is the same arithmetic."""
    from slipstream.config import load_config
    from slipstream.run.components import engine_shape, resolve_placement

    cfg = ModelConfig(
        vocab_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    model = CausalLM(cfg)  # float32, as `setup` builds the trainer's model
    free = 2_000_000
    monkeypatch.setattr(capacity, "free_device_bytes", lambda device: free)
    run_cfg = load_config(
        None, ["model.dtype=bfloat16", "engine.memory_fraction=0.5", "sampling.max_new_tokens=8"]
    )
    slots, max_len = engine_shape(run_cfg, resolve_placement(run_cfg), model, [8], 1000)
    packed = PackedWeights(model, max_len)
    kv = SlotKV(cfg, slots, max_len, model.lm_head.weight.dtype, "cpu")
    cache_bytes = tensor_bytes(kv.k + kv.v)
    assert cache_bytes <= 0.5 * (free - capacity.packed_bytes(cfg, torch.float32))
    assert packed.lm_head.dtype == torch.float32  # what the engine packs, and pays for


def test_engines_on_one_gpu_split_the_memory_fraction(monkeypatch):
    """Every engine of a local run measures the GPU's free memory before any of them allocates
    its KV cache: on one GPU, the trainer's evaluation engine and a colocated sampler each took
    the whole `memory_fraction` (0.4 + 0.4 of the free memory at the README's setting). Now the
    engines on a GPU split it, each within its part of the free memory less its own packed
    copy (placement.memory_share); on the in-process loop the one engine keeps it all."""
    from slipstream.config import load_config
    from slipstream.run.components import engine_shape, resolve_placement
    from slipstream.runtime import placement as pl

    where = pl.Placement("cuda:0", ("cuda:0", "cuda:1", "cuda:1"))
    assert [where.engines_on(d) for d in ("cuda:0", "cuda:1", "cuda:2", "cpu")] == [2, 2, 0, 1]
    cfg = ModelConfig(
        vocab_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    model = CausalLM(cfg)
    monkeypatch.setattr(capacity, "free_device_bytes", lambda device: 2_000_000)
    monkeypatch.setattr(pl, "cuda_device_count", lambda: 1)
    base = ["engine.memory_fraction=0.5", "sampling.max_new_tokens=8", "trainer.device=cuda"]

    def shape(overrides: list[str], where: pl.Placement | None = None) -> int:
        run_cfg = load_config(None, overrides)  # `where`: setup's placement unless given
        return engine_shape(run_cfg, where or resolve_placement(run_cfg), model, [8], 10_000)[0]

    alone = shape(base)
    local = [*base, "schedule.name=pipeline", "runtime.kind=local"]
    shared = shape(local)
    packed = capacity.packed_bytes(cfg, torch.float32)
    per_token = capacity.kv_bytes_per_token(cfg, torch.float32)
    # max_len 16: prompt 8 + 8 new. Alone: 0.5 of (2,000,000 - 65,536) B = 967,232 B =
    # 3,778 tokens = 236 rows, 235 slots beside the scratch row
    assert alone == int(0.5 * (2_000_000 - packed)) // per_token // 16 - 1 == 235
    # two engines on the GPU: each 0.5 of its half less its own packed copy (memory_share):
    # 0.5 x (1,000,000 - 65,536) = 467,232 B = 1,825 tokens = 114 rows, 113 slots
    assert shared == int(0.5 * (1_000_000 - packed)) // per_token // 16 - 1 == 113
    # the split follows the placement setup passes: two samplers beside the trainer, 3 ways
    three = shape(local, pl.Placement("cuda:0", ("cuda:0", "cuda:0")))
    assert three == int(0.5 * (2_000_000 // 3 - packed)) // per_token // 16 - 1


def _tiny_engine_shape(monkeypatch: pytest.MonkeyPatch, *over: str) -> int:
    """The slots `engine_shape` gives the trainer's engine of a tiny float32 model on a GPU
    reporting 2,000,000 B free (max_len 16), under the overrides `over`."""
    from slipstream.config import load_config
    from slipstream.run.components import engine_shape, resolve_placement
    from slipstream.runtime import placement as pl

    cfg = ModelConfig(
        vocab_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    monkeypatch.setattr(capacity, "free_device_bytes", lambda device: 2_000_000)
    monkeypatch.setattr(pl, "cuda_device_count", lambda: 1)
    base = ["engine.memory_fraction=0.5", "sampling.max_new_tokens=8", "trainer.device=cuda"]
    run_cfg = load_config(None, [*base, *over])
    return engine_shape(run_cfg, resolve_placement(run_cfg), CausalLM(cfg), [8], 10_000)[0]


def test_a_ray_actor_on_a_fraction_of_a_gpu_sizes_its_engine_within_that_fraction(monkeypatch):
    """Ray packs actors that ask for `GPU = 0.5` two to a GPU but divides none of its memory:
    before, each engine took `engine.memory_fraction` of the whole GPU's free memory, so two
    such engines took twice the fraction. Now an actor's engine sizes itself within the
    fraction of the GPU it asked for, as the engines of a local run on one GPU split it."""
    ray = ["schedule.name=pipeline", "runtime.kind=ray"]
    half = _tiny_engine_shape(monkeypatch, *ray, "runtime.trainer_resources={GPU = 0.5}")
    # 0.5 x (0.5 x 2,000,000 - 65,536 packed) = 467,232 B: 113 slots (as two local engines)
    assert half == 113
    assert _tiny_engine_shape(monkeypatch, *ray, "runtime.trainer_resources={GPU = 1}") == 235
    assert _tiny_engine_shape(monkeypatch, *ray) == 235  # no GPU asked of Ray: the whole GPU

    from slipstream.config import load_config
    from slipstream.run.components import engine_share
    from slipstream.runtime.placement import Placement

    where = Placement("cuda:0", ("cuda:0", "cuda:0"))  # each actor's own cuda:0
    cfg = load_config(None, [*ray, "runtime.sampler_resources={GPU = 0.25, CPU = 2}"])
    assert engine_share(cfg, where, 0) == engine_share(cfg, where, 1) == 0.25
    assert engine_share(cfg, where) == 1.0  # the trainer actor asked for no GPU
    in_driver = ["runtime.trainer_actor=false", "runtime.trainer_resources={GPU = 0.5}"]
    assert engine_share(load_config(None, [*ray, *in_driver]), where) == 1.0  # not an actor
    local = load_config(None, ["schedule.name=pipeline", "runtime.kind=local"])
    assert engine_share(local, Placement("cuda:0", ("cuda:0", "cuda:1"))) == 0.5
    assert engine_share(local, Placement("cuda:0", ("cuda:0", "cuda:1")), 1) == 1.0


def test_memory_share_rule():
    from slipstream.runtime.placement import memory_share

    assert memory_share("local", 4, 0.5) == 0.25  # local: the engines on the GPU split it
    assert memory_share("local", 0, 0.0) == 1.0
    assert memory_share("ray", 3, 0.5) == 0.5  # Ray: the fraction asked for
    assert memory_share("ray", 3, 1.0) == memory_share("ray", 3, 0.0) == 1.0
    assert memory_share("ray", 3, 2.0) == 1.0  # two GPUs: the engine uses one, all of it
    assert memory_share("inprocess", 2, 0.5) == 1.0


@pytest.mark.parametrize(
    "own, shares",
    [(30 * 10**9, (0.5, 0.5)), (6_200_000_000, (0.25, 0.25, 0.5)), (6_200_000_000, (1 / 3,) * 3)],
)
@pytest.mark.parametrize("fraction", [0.5, 0.95])
def test_engines_sharing_a_gpu_allocate_at_most_its_free_memory(own, shares, fraction):
    """Engines on one GPU of 80 GB free (measured by each before any allocates), each with a
    packed copy and a staging copy of its weights beside its KV cache (`own`: 15 GB each for a
    7B model, 3.1 GB for Qwen2.5-1.5B), allocate at most that memory together. Before, each
    took its part of the fraction of the free memory less only its own copies: at 0.95, two
    7B engines took 2 x (30 + 0.475 x 50) = 107.5 GB, three 1.5B ones 88.7 GB."""
    free = 80 * 10**9
    budgets = [capacity.memory_budget(free, fraction, own, s) for s in shares]
    assert all(b > 0 for b in budgets)
    assert sum(own + b for b in budgets) <= free
