"""Chat templates: a model's own Jinja template, rendered as `transformers` renders it.

`ChatTemplate.render(messages)` equals `AutoTokenizer.apply_chat_template(messages,
tokenize=False, add_generation_prompt=True)` for the same folder: the same sandboxed Jinja
environment (trim_blocks, lstrip_blocks, loop controls, the `generation` tag), the same globals
(`raise_exception`, `strftime_now`, `namespace`, `dict`), the same `tojson` filter (no HTML
escaping, `ensure_ascii=False`), and the special tokens (`bos_token`, `eos_token`, ...) as
strings. A template is untrusted code from a model hub: the sandbox keeps it from Python's
internals.

Where the template comes from (`task.chat_template`): `auto` is the model folder's own
(`chat_template.jinja`, `chat_template.json`, or tokenizer_config.json's `chat_template`,
in the order transformers reads them), `none` renders nothing, and a path reads a template file.
Template variables (`task.chat_template_kwargs`, e.g. Qwen3's `enable_thinking`) are passed to
every rendering, as `apply_chat_template(..., **kwargs)` passes them (over the special tokens).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

# the named special tokens transformers renders a template with (its tokenizers'
# `SPECIAL_TOKENS_ATTRIBUTES`, which `apply_chat_template` passes as `special_tokens_map`)
SPECIAL_KEYS = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)  # fmt: skip


class ChatTemplateError(ValueError):
    """A chat template that cannot be read, compiled or rendered; names where it came from."""


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


@dataclass
class ChatTemplate:
    """A compiled chat template and the special-token strings it is rendered with."""

    source: str
    origin: str = "chat template"  # where it was read from, for messages
    special_tokens: dict[str, Any] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)  # template variables, every render

    def __post_init__(self) -> None:
        try:
            self._template = _environment().from_string(self.source)
        except Exception as e:  # a Jinja syntax error: say where the template came from
            raise ChatTemplateError(f"{self.origin}: not a valid Jinja template ({e})") from None

    def __getstate__(self) -> dict[str, Any]:  # the compiled template is rebuilt after pickling
        keep = ("source", "origin", "special_tokens", "kwargs")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The text of `messages`, ending with the assistant's turn opened (generation prompt);
        `tools`: OpenAI-style function schemas, as `apply_chat_template(..., tools=tools)`."""
        try:
            return self._template.render(
                messages=messages,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **{**self.special_tokens, **self.kwargs},
            )
        except Exception as e:  # raise_exception() in the template, or a template bug
            raise ChatTemplateError(f"{self.origin}: rendering failed ({e})") from None


def _environment() -> Any:
    """The sandboxed Jinja environment transformers renders chat templates in."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (assistant-mask templates): the body."""

        tags = {"generation"}  # noqa: RUF012 - jinja's own class attribute

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno
            )

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    class Namespace(jinja2.utils.Namespace):
        """`namespace(...)` without underscore attributes (no way to CPython internals)."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                _check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            _check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r}")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = Namespace
    return env


class _TemplateDict:
    """`dict(...)` and `dict.fromkeys(...)` in a template, without the type object itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _special_tokens(folder: Path) -> dict[str, Any]:
    """The named special tokens as strings, from tokenizer_config.json and
    special_tokens_map.json: what transformers 5 renders a template with (its
    `special_tokens_map`; the additional special tokens are not among them)."""
    out: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the config wins
        f = folder / name
        if not f.exists():
            continue
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ChatTemplateError(f"{f}: not valid JSON ({e})") from None
        for key in SPECIAL_KEYS:
            text = _token_text(data.get(key)) if isinstance(data, dict) else None
            if text is not None:
                out[key] = text
    return out


def _folder_template(folder: Path) -> tuple[str, str] | None:
    """`(template source, file it came from)` of a model folder, or None."""
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text(encoding="utf-8"), str(jinja)
    for name in ("chat_template.json", "tokenizer_config.json"):
        f = folder / name
        if not f.exists():
            continue
        try:
            raw = json.loads(f.read_text(encoding="utf-8")).get("chat_template")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            raise ChatTemplateError(f"{f}: not valid JSON ({e})") from None
        if isinstance(raw, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
            raw = named.get("default")
        if isinstance(raw, str) and raw.strip():
            return raw, f"{f} (chat_template)"
    return None


def load_chat_template(
    setting: str, model_path: str | None, kwargs: dict[str, Any] | None = None
) -> ChatTemplate | None:
    """The template `task.chat_template` selects (`auto` | `none` | a file), or None; `kwargs`:
    the variables every rendering gets (`task.chat_template_kwargs`)."""
    if setting == "none":
        return None
    folder = Path(model_path) if model_path else None
    specials = _special_tokens(folder) if folder is not None else {}
    if setting == "auto":
        found = _folder_template(folder) if folder is not None else None
        return ChatTemplate(found[0], found[1], specials, dict(kwargs or {})) if found else None
    f = Path(setting)
    if not f.is_file():
        raise ChatTemplateError(f"task.chat_template: no such file {f} (or 'auto', 'none')")
    return ChatTemplate(f.read_text(encoding="utf-8"), str(f), specials, dict(kwargs or {}))
