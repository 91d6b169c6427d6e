"""Tool turns through the model's own chat template (Qwen2.5's tools template, built here):
the same text as `transformers`' `apply_chat_template(..., tools=...)`, token in, token out."""

from __future__ import annotations

from pathlib import Path

import pytest

from chat_model import CHAT_TEMPLATE, QWEN25_TOOLS_TEMPLATE, qwen2_tokenizer
from slipstream.config import load_config
from slipstream.envs import PlainRenderer, ToolEnv
from slipstream.envs.render import HermesRenderer, TemplateRenderer, supports_tools
from slipstream.model.chat import ChatTemplate, load_chat_template
from slipstream.model.tokenizer import load_tokenizer
from slipstream.schedule.agentic import tool_renderer
from slipstream.types import Prompt

transformers = pytest.importorskip("transformers")


class Calc:
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def test_supports_tools_tells_a_tools_template_from_a_plain_one() -> None:
    assert supports_tools(ChatTemplate(QWEN25_TOOLS_TEMPLATE))
    assert not supports_tools(ChatTemplate(CHAT_TEMPLATE))  # renders `tool` turns, no tools


def test_a_tool_episode_is_the_templates_rendering_token_in_token_out(tmp_path: Path) -> None:
    folder = qwen2_tokenizer(tmp_path / "m", QWEN25_TOOLS_TEMPLATE)
    tok = load_tokenizer(folder)
    template = load_chat_template("auto", str(folder))
    assert template is not None
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    row = Prompt("r", template.render(messages), "5", messages=messages)
    env = ToolEnv(Calc(), row, tok, "hermes", TemplateRenderer(template), reward=_exact)
    schemas = [s.schema() for s in env.specs]

    def hf_text(msgs: list[dict]) -> str:
        return hf.apply_chat_template(
            msgs, tools=schemas, tokenize=False, add_generation_prompt=True
        )

    obs = env.initial_observation()
    assert obs.text == hf_text(messages) and "<tools>" in obs.text
    assert obs.tokens == hf.encode(obs.text, add_special_tokens=False)
    turn = [*tok.encode(CALL, add_special_tokens=False), tok.eos_id]  # ends at <|im_end|>
    res = env.step(turn)
    assert not res.done and res.metrics == {"tool_calls": 1.0, "tool_errors": 0.0}
    assert res.next_observation is not None
    # the episode's tokens, never re-tokenized, are exactly the conversation's rendering
    seq = obs.tokens + turn + res.next_observation.tokens
    convo = [*messages, {"role": "assistant", "content": CALL}, {"role": "tool", "content": "5"}]
    assert tok.inner.decode(seq, skip_special_tokens=False) == hf_text(convo)
    assert res.next_observation.text.startswith("\n<|im_start|>user\n<tool_response>\n5\n")
    final = env.step([*tok.encode("5", add_special_tokens=False), tok.eos_id])
    assert final.done and final.reward == 1.0


def test_two_replies_share_one_turn_and_errors_are_replies(tmp_path: Path) -> None:
    folder = qwen2_tokenizer(tmp_path / "m", QWEN25_TOOLS_TEMPLATE)
    tok = load_tokenizer(folder)
    template = load_chat_template("auto", str(folder))
    assert template is not None
    env = ToolEnv(Calc(), Prompt("r", "x", "5"), tok, "hermes", TemplateRenderer(template))
    env.initial_observation()
    bad = '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'
    res = env.step([*tok.encode(CALL + "\n" + bad, add_special_tokens=False), tok.eos_id])
    assert res.next_observation is not None and res.metrics["tool_errors"] == 1.0
    text = res.next_observation.text
    assert text.count("<tool_response>") == 2 and text.count("<|im_start|>user") == 1
    assert "error: unknown tool 'nope'" in text


def test_tool_format_auto_uses_the_template_when_it_renders_tools(tmp_path: Path) -> None:
    def pick(template: str, fmt: str) -> object:
        folder = qwen2_tokenizer(tmp_path / f"m{len(list(tmp_path.iterdir()))}", template)
        cfg = load_config(None, [f'model.path="{folder}"', f"env.tool_format={fmt}"])
        return tool_renderer(cfg, load_tokenizer(folder))

    fmt, r = pick(QWEN25_TOOLS_TEMPLATE, "auto")
    assert fmt == "hermes" and isinstance(r, TemplateRenderer)
    fmt, r = pick(CHAT_TEMPLATE, "auto")
    assert fmt == "plain" and isinstance(r, PlainRenderer)
    fmt, r = pick(CHAT_TEMPLATE, "hermes")  # asked for, without a tools template: ChatML
    assert fmt == "hermes" and isinstance(r, HermesRenderer)


def _exact(prompt: Prompt, completion: str) -> float:
    return float(completion.strip() == prompt.answer)
