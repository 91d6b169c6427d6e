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
