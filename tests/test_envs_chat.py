"""Tool turns through the model's own chat template (Qwen2.5's tools template, built here):
the same text as `transformers`' `apply_chat_template(..., tools=...)`, token in, token out."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chat_model import CHAT_TEMPLATE, QWEN25_TOOLS_TEMPLATE, llama3_tokenizer, qwen2_tokenizer
from slipstream.config import ConfigError, load_config
from slipstream.envs import PlainRenderer, ToolEnv, tool_specs
from slipstream.envs.render import HermesRenderer, TemplateRenderer, supports_tools
from slipstream.envs.tools import ToolReply
from slipstream.model.chat import ChatTemplate, load_chat_template
from slipstream.model.tokenizer import load_tokenizer
from slipstream.run.agentic import tool_renderer
from slipstream.types import Prompt

transformers = pytest.importorskip("transformers")


class Calc:
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def _hf_text(hf, env):
    """What transformers renders for a conversation with `env`'s tools (the reference)."""
    schemas = [s.schema() for s in env.specs]
    return lambda msgs: hf.apply_chat_template(
        msgs, tools=schemas, tokenize=False, add_generation_prompt=True
    )


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
    hf_text = _hf_text(hf, env)

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


def test_hermes_strings_write_out_the_rows_conversation(tmp_path: Path) -> None:
    """`HermesRenderer` (hermes asked for, the template renders no tools) on a row rendered
    through the chat template: the first prompt is the conversation in Qwen2.5's tools format,
    its system turn kept (before, the rendered conversation was put inside one user turn)."""
    tok = load_tokenizer(qwen2_tokenizer(tmp_path / "m"))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    row = Prompt("r", ChatTemplate(CHAT_TEMPLATE).render(messages), "5", messages=messages)
    env = ToolEnv(Calc(), row, tok, "hermes", HermesRenderer())
    obs = env.initial_observation()
    tools = [s.schema() for s in env.specs]
    assert obs.text == ChatTemplate(QWEN25_TOOLS_TEMPLATE).render(messages, tools=tools)
    assert obs.tokens == tok.encode(obs.text, add_special_tokens=False)


def test_plain_format_on_a_chat_row_puts_the_tools_in_its_first_user_turn(tmp_path: Path) -> None:
    """`env.tool_format=auto` with a chat template that renders no tools: plain calls, the
    tool list opening the row's first user turn, the conversation rendered by the template and
    encoded with no BOS added (before: the list came before the rendered conversation, and a
    BOS-adding tokenizer put a BOS in front of the template's own)."""
    folder = llama3_tokenizer(tmp_path / "m")
    tok = load_tokenizer(folder)
    cfg = load_config(None, [f'model.path="{folder}"'])
    fmt, renderer = tool_renderer(cfg, tok)
    template = load_chat_template("auto", str(folder))
    assert fmt == "plain" and template is not None
    messages = [{"role": "user", "content": "2+3?"}]
    row = Prompt("r", template.render(messages), "5", messages=messages)
    obs = ToolEnv(Calc(), row, tok, fmt, renderer).initial_observation()
    listed = PlainRenderer().prompt("2+3?", tool_specs(Calc()))
    assert listed.startswith("Tools:\n- add(a, b)") and listed.endswith("\n2+3?")
    assert obs.text == template.render([{"role": "user", "content": listed}])
    assert obs.tokens == tok.encode(obs.text, add_special_tokens=False)


def test_plain_replies_on_a_chat_row_are_a_user_turn_of_the_template(tmp_path: Path) -> None:
    """`env.tool_format=auto` with a template that renders no tools: the replies are a user
    turn rendered by it, then the next assistant turn opened, so the episode's tokens are the
    template's rendering of the conversation (before: bare `RESULT` text after the model's
    `<|im_end|>`, with no user turn and no generation prompt); a cut turn is closed first."""
    folder = qwen2_tokenizer(tmp_path / "m", CHAT_TEMPLATE)
    tok = load_tokenizer(folder)
    fmt, renderer = tool_renderer(load_config(None, [f'model.path="{folder}"']), tok)
    template = load_chat_template("auto", str(folder))
    assert fmt == "plain" and template is not None
    messages = [{"role": "user", "content": "2+3?"}]
    row = Prompt("r", template.render(messages), "5", messages=messages)
    env = ToolEnv(Calc(), row, tok, fmt, renderer)
    obs = env.initial_observation()
    call = 'CALL add {"a": 2, "b": 3}'
    turn = [*tok.encode(call, add_special_tokens=False), tok.eos_id]
    res = env.step(turn)
    assert res.next_observation is not None
    convo = [
        {"role": "user", "content": _first_user(obs.text)},  # with the tool list
        {"role": "assistant", "content": call},
        {"role": "user", "content": "RESULT add: 5"},
    ]
    seq = obs.tokens + turn + res.next_observation.tokens
    assert tok.inner.decode(seq, skip_special_tokens=False) == template.render(convo)
    cut = env.step(tok.encode(call, add_special_tokens=False))  # no <|im_end|>
    assert cut.next_observation is not None
    assert cut.next_observation.tokens == [tok.eos_id, *res.next_observation.tokens]


def _first_user(text: str) -> str:
    """The content of the first user turn in ChatML `text`."""
    return text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]


@pytest.mark.parametrize("kind", ["template", "hermes"])
def test_a_turn_cut_by_its_budget_is_closed_before_the_replies(tmp_path: Path, kind: str) -> None:
    """A turn with a call, cut by its token budget before the model's `<|im_end|>`: the
    observation closes it first, so the episode's tokens are still the conversation's
    rendering (before, the replies followed the open assistant turn)."""
    folder = qwen2_tokenizer(tmp_path / "m", QWEN25_TOOLS_TEMPLATE)
    tok = load_tokenizer(folder)
    template = load_chat_template("auto", str(folder))
    assert template is not None
    renderer = TemplateRenderer(template) if kind == "template" else HermesRenderer()
    env = ToolEnv(Calc(), Prompt("r", "2+3?", "5"), tok, "hermes", renderer)
    env.initial_observation()
    cut = env.step(tok.encode(CALL, add_special_tokens=False))  # no <|im_end|>
    whole = env.step([*tok.encode(CALL, add_special_tokens=False), tok.eos_id])
    assert cut.next_observation is not None and whole.next_observation is not None
    assert cut.next_observation.text == "<|im_end|>" + whole.next_observation.text
    assert cut.next_observation.tokens == [tok.eos_id, *whole.next_observation.tokens]


@pytest.mark.parametrize("stop", ["string", "endoftext"])
def test_a_call_ended_by_another_stop_is_parsed_and_its_turn_closed(
    tmp_path: Path, stop: str
) -> None:
    """A hermes call whose turn stopped at `sampling.stop=["</tool_call>"]` (the decoded text
    lacked the tag: every call was "not closed") or at Qwen's `<|endoftext|>` (a stop id, not
    the end-of-turn `<|im_end|>`, which was then left out): the call runs, and `<|im_end|>`
    closes the turn before the replies, as for a turn ending at `<|im_end|>`."""
    folder = qwen2_tokenizer(tmp_path / "m", QWEN25_TOOLS_TEMPLATE)
    base = load_tokenizer(folder)
    tok = base.with_stop_strings(["</tool_call>"]) if stop == "string" else base
    template = load_chat_template("auto", str(folder))
    assert template is not None
    env = ToolEnv(Calc(), Prompt("r", "2+3?", "5"), tok, "hermes", TemplateRenderer(template))
    env.initial_observation()
    call = tok.encode(CALL, add_special_tokens=False)
    eot = tok.inner.token_to_id("<|endoftext|>")
    assert eot in tok.stop_ids and eot != tok.eos_id
    res = env.step(call if stop == "string" else [*call, eot])
    whole = env.step([*call, tok.eos_id])
    assert res.metrics == {"tool_calls": 1.0, "tool_errors": 0.0}
    assert res.next_observation is not None and whole.next_observation is not None
    assert res.next_observation.tokens == [tok.eos_id, *whole.next_observation.tokens]


def test_qwen3s_template_renders_the_replies_after_the_models_turn() -> None:
    """Qwen3's template (tests/data/templates/qwen3.jinja) writes an empty think block into an
    assistant turn only when it is the last message, so the conversation with tool replies does
    not extend the one without; the replies are what follows the model's `<|im_end|>` (before,
    every call raised "does not extend" and the episode ended `error`)."""
    text = (Path(__file__).parent / "data" / "templates" / "qwen3.jinja").read_text()
    template = ChatTemplate(text, special_tokens={"eos_token": "<|im_end|>"})
    assert supports_tools(template)
    reply = ToolReply("add", "5")
    assert TemplateRenderer(template).replies([reply]) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_a_base_models_eos_does_not_close_a_chatml_turn() -> None:
    """A Qwen2.5 base folder's `eos_token` is `<|endoftext|>`; its template ends turns with
    `<|im_end|>`, which is what closes a turn cut by its budget (before: the eos)."""
    base = ChatTemplate(QWEN25_TOOLS_TEMPLATE, special_tokens={"eos_token": "<|endoftext|>"})
    assert TemplateRenderer(base).end_of_turn == "<|im_end|>"
    assert TemplateRenderer(base, end_of_turn="<|x|>").end_of_turn == "<|x|>"


LLAMA31 = Path(__file__).parent / "data" / "templates" / "llama31.jinja"


def _llama31_folder(path: Path) -> Path:
    """A Llama-3 tokenizer folder with Llama 3.1-Instruct's tools template (which asks for a
    bare `{"name": ..., "parameters": ...}` object, no `<tool_call>` tags)."""
    folder = llama3_tokenizer(path)
    (folder / "chat_template.jinja").write_text(LLAMA31.read_text())
    return folder


def test_a_llama31_template_gets_bare_json_calls_token_in_token_out(tmp_path: Path) -> None:
    """`env.tool_format=auto` with Llama 3.1's tools template: the `json` format, so the call
    the template asks for is run (before: `hermes`, which looks only for `<tool_call>` tags,
    so every call ended the episode as its answer); the episode's tokens are the template's
    rendering of the conversation with the call and its reply, as transformers renders it."""
    folder = _llama31_folder(tmp_path / "m")
    tok = load_tokenizer(folder)
    cfg = load_config(None, [f'model.path="{folder}"'])
    fmt, renderer = tool_renderer(cfg, tok)
    assert fmt == "json" and isinstance(renderer, TemplateRenderer)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    messages = [{"role": "user", "content": "2+3?"}]
    env = ToolEnv(Calc(), Prompt("r", "2+3?", "5", messages=messages), tok, fmt, renderer, _exact)
    hf_text = _hf_text(hf, env)

    obs = env.initial_observation()
    assert obs.text == hf_text(messages) and '"parameters": dictionary' in obs.text
    call = '{"name": "add", "parameters": {"a": 2, "b": 3}}'
    eot = tok.inner.token_to_id("<|eot_id|>")
    turn = [*tok.encode(call, add_special_tokens=False), eot]
    res = env.step(turn)
    assert not res.done and res.metrics == {"tool_calls": 1.0, "tool_errors": 0.0}
    assert res.next_observation is not None
    seq = obs.tokens + turn + res.next_observation.tokens
    called = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    convo = [
        *messages,
        {"role": "assistant", "tool_calls": [called]},
        {"role": "tool", "content": "5"},
    ]
    assert tok.inner.decode(seq, skip_special_tokens=False) == hf_text(convo)
    final = env.step([*tok.encode("5", add_special_tokens=False), eot])
    assert final.done and final.reward == 1.0


@pytest.mark.parametrize(
    ("template", "fmt", "error"),
    [
        (
            "llama31",
            "hermes",
            "env.tool_format: hermes, but the model's chat template asks for json",
        ),
        ("plain", "json", "env.tool_format: json needs a chat template that renders tools"),
    ],
)
def test_a_tool_format_the_template_does_not_ask_for_is_an_error(
    tmp_path: Path, template: str, fmt: str, error: str
) -> None:
    """Before, `hermes` on Llama 3.1's template parsed none of the calls it asks for."""
    folder = (
        _llama31_folder(tmp_path / "m") if template == "llama31" else llama3_tokenizer(tmp_path)
    )
    cfg = load_config(None, [f'model.path="{folder}"', f"env.tool_format={fmt}"])
    with pytest.raises(ConfigError, match=f"^{re.escape(error)}"):
        tool_renderer(cfg, load_tokenizer(folder))
