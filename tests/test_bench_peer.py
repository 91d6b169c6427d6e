"""bench/peer_trl.py's harness and timing: the tokenizer's <bos> reaches slipstream's prompts
without a prompt_template, and the steady step time leaves out what it says."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import peer_harness
import peer_trl
from slipstream.model import load_tokenizer
from slipstream.types import Prompt

transformers = pytest.importorskip("transformers")


def test_harness_prompts_carry_the_post_processors_bos(tmp_path):
    peer_harness.write_tokenizer(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    tok = load_tokenizer(tmp_path)
    for text in ("12+7=", "0+99="):
        ids = tok.encode_prompt(Prompt("p", text, ""))
        assert ids == hf(text)["input_ids"]
        assert ids[0] == tok.bos_id == hf.bos_token_id
        assert len(ids) == len(text) + 1  # one token per character, then nothing added
    assert tok.decode([*tok.encode("19", add_special_tokens=False), tok.eos_id]) == "19"


def test_steady_step_time_skips_step_one_and_the_named_steps():
    ends = [1.0, 1.5, 2.0, 4.0, 4.5]  # steps 1..5 end here; step 4 (2 s) holds a snapshot
    assert peer_trl.steady(ends, skip={4}, upto=5) == pytest.approx(0.5)
    assert peer_trl.steady(ends, skip=set(), upto=3) == pytest.approx(0.5)


def test_the_json_speedup_is_the_printed_mean_over_seed_pairs(capsys):
    # seed pairs at 2x and 1x: the table prints their mean, 1.50x (1.00x-2.00x); the ratio of
    # the mean step times, (0.4 + 0.1) / (0.2 + 0.1) = 1.67, is not that figure
    def run(s_per_step: float) -> dict:
        return {"s_per_step": {1: s_per_step, 2: s_per_step}, "acc": {1: 0.6, 2: 0.7},
                "split": {"time/generate_s": 0.0, "time/train_s": 0.0},
                "own_heldout_start": 0.5}  # fmt: skip

    res = {"slipstream": [run(0.2), run(0.1)], "trl": [run(0.4), run(0.1)]}
    res["trl"][0]["info"] = {"versions": {"trl": "x"}, "settings": {}}
    a = type("A", (), {"snapshot": 1, "steps": 2, "seeds": [0, 1], "threads": 1})()
    peer_trl.report(res, a, 0.5, {})
    out = capsys.readouterr().out
    line = json.loads(out.strip().splitlines()[-1])
    assert "1.50x (1.00x-2.00x)" in out
    assert line["speedup"] == pytest.approx(1.5) and line["speedup_1"] == pytest.approx(1.5)
    assert line["speedup_range"] == [1.0, 2.0]
