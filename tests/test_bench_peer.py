"""bench/peer_trl.py's harness and timing: the tokenizer's <bos> reaches slipstream's prompts
without a prompt_template, and the steady step time leaves out what it says."""

from __future__ import annotations

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
