"""The context an episode run's engine gets (`run.agentic.env_max_len`) fits every row."""

from __future__ import annotations

import string

from slipstream.config import Config
from slipstream.envs import ToolEnv
from slipstream.envs.render import TemplateRenderer
from slipstream.model.chat import ChatTemplate
from slipstream.model.tokenizer import char_tokenizer
from slipstream.run.agentic import env_max_len
from slipstream.types import Prompt

TOK = char_tokenizer(string.printable)
# a template that lists the tools before every user turn (as some list them before the last)
TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'user' and tools %}{% for t in tools %}"
    "[tool {{ t.function.name }}: {{ t.function.description }}]{% endfor %}{% endif %}"
    "<{{ m.role }}>{{ m.content }}</s>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


class Tools:
    def reset(self, **row: object) -> str | None:
        return "the first row's extra" if row["id"] == "one" else None

    def lookup(self, query: str) -> str:
        """Look a query up in a long, long index of everything there is to know."""
        return query


def test_every_row_s_first_observation_fits_the_context() -> None:
    """Before, the overhead of the first row's rendering over its text was taken for every
    row: a later row whose rendering adds more (here the tool list shown before each of its
    three user turns, or a longer system turn) did not fit. Now each row's first observation
    is rendered; what `reset` adds is measured on the first row."""
    chat = ChatTemplate(TEMPLATE, "t", {"eos_token": "</s>"})
    convs = [
        [{"role": "user", "content": "hi"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
         {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"},
         {"role": "user", "content": "e"}],
    ]  # fmt: skip
    rows = [Prompt(i, chat.render(m), None, messages=m) for i, m in zip(["one", "two"], convs)]

    def factory(row: Prompt) -> ToolEnv:
        return ToolEnv(Tools(), row, TOK, "hermes", TemplateRenderer(chat))

    cfg = Config()
    need = [len(factory(r).initial_observation().tokens) for r in rows]
    extra = len(TOK.encode("\nthe first row's extra", add_special_tokens=False))
    want = max(need[0], need[1] + extra) + cfg.env.max_tokens + 1
    assert env_max_len(cfg, factory, rows, TOK) == want


def test_first_observations_the_model_cannot_hold_are_refused_or_said() -> None:
    """Before, a run whose episodes' first observations (prompt with the tools rendered) were
    all longer than the model's context started, ended every episode `length` with no token
    and skipped every step; now it is one error before the run, and a warning for some."""
    import pytest

    from slipstream.config import ConfigError
    from slipstream.run.agentic import check_first_observations

    with pytest.raises(ConfigError, match=r"no episode's first observation .* 512 tokens"):
        check_first_observations([585, 600], 512)
    with pytest.warns(UserWarning, match="1 of 2 episodes' first observations do not fit"):
        check_first_observations([300, 600], 512)
    check_first_observations([300, 511], 512)  # room for one token each: nothing said
    chat = ChatTemplate(TEMPLATE, "t", {"eos_token": "</s>"})
    m = [{"role": "user", "content": "hi"}]
    row = Prompt("one", chat.render(m), None, messages=m)
    env = ToolEnv(Tools(), row, TOK, "hermes", TemplateRenderer(chat))
    with pytest.raises(ConfigError, match="context of 16 tokens"):
        env_max_len(Config(), lambda r: env, [row], TOK, positions=16)
