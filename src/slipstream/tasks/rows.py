"""Dataset rows -> `Prompt`s: the prompt or conversation, the answer, and every other column.

A row's prompt is its `messages` column (a list of `{"role", "content"}`) or its `prompt`
column (a string, or a list of messages as verl's datasets have it); `task.columns` maps a
file's own names onto `prompt`, `messages`, `answer` and `id`. The answer is verl's
`reward_model.ground_truth`, where verl reads it, else the `answer` column, `ground_truth` or
`solution` (a mapped `answer` column comes first). Every column but the prompt's travels with
the `Prompt` (`meta`) to the reward functions.

With a chat template (`task.chat_template`), a conversation, or a plain prompt as the one user
turn, is rendered with the generation prompt opened, after `task.system_prompt` as its first
turn when it has none; without one a plain prompt is `task.prompt_template` filled in.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from slipstream.tasks.datasets import Row, Split, read_table
from slipstream.tasks.jsonl import TaskError
from slipstream.text import is_text
from slipstream.types import Prompt


class ChatRenderer(Protocol):
    """A chat template (model.chat.ChatTemplate): messages -> text, generation prompt opened;
    raises ValueError naming the template when it cannot render them."""

    def render(self, messages: list[dict[str, Any]]) -> str: ...


FIELDS = ("prompt", "messages", "answer", "id")
ANSWER_COLUMNS = ("answer", "ground_truth", "solution")


@dataclass
class RowFormat:
    """How a row becomes a `Prompt` (module docstring)."""

    columns: dict[str, str] = field(default_factory=dict)
    template: str = "{prompt}"
    chat: ChatRenderer | None = None
    system_prompt: str | None = None
    need_answer: bool = True  # the built-in rewards compare with the answer
    chat_off: bool = False  # task.chat_template = 'none': no template, by the user's choice

    def __post_init__(self) -> None:
        unknown = sorted(set(self.columns) - set(FIELDS))
        if unknown:
            raise TaskError(f"task.columns: unknown field {unknown[0]!r}; expected {FIELDS}")

    def prompt(self, row: Row, default_id: str) -> Prompt:
        """The `Prompt` of one row; a bad row raises `TaskError` naming file, row and column."""
        where, data = row.where, row.data
        col, value = self._prompt_column(row)
        plain = None
        if isinstance(value, str):
            if not value:
                raise TaskError(f"{where}: column {col!r}: empty prompt")
            text = self.template.replace("{prompt}", value)
            messages = [{"role": "user", "content": text}] if self.chat is not None else None
            plain = text if messages is not None else None
        else:
            messages = _messages(value, where, col)
            text = ""
        if messages is not None:
            messages, text = self._render(messages, where, col)
        answer = self._answer(row)
        id_col = self.columns.get("id", "id")
        pid = str(data[id_col]) if data.get(id_col) is not None else default_id
        if not is_text(text + str(answer) + pid):
            raise TaskError(
                f"{where}: a lone surrogate (\\ud800-\\udfff) is not text a tokenizer can take"
            )
        meta = {k: v for k, v in data.items() if k != col}
        return Prompt(
            id=pid, text=text, answer=answer, meta=meta, messages=messages, plain_prompt=plain
        )

    def _prompt_column(self, row: Row) -> tuple[str, Any]:
        given = [self.columns[k] for k in ("messages", "prompt") if k in self.columns]
        names = given or ["messages", "prompt"]
        for name in names:
            if name in row.data and row.data[name] is not None:
                return name, row.data[name]
        have = ", ".join(map(repr, row.data)) or "none"
        raise TaskError(
            f"{row.where}: missing column {' or '.join(map(repr, names))} (columns here: {have}; "
            "map yours with task.columns)"
        )

    def _render(self, messages: list[dict[str, Any]], where: str, col: str) -> tuple[list, str]:
        if self.chat is None and self.chat_off:
            raise TaskError(
                f"{where}: task.chat_template = 'none' cannot render {col!r} rows; use 'auto' "
                "or a template file"
            )
        if self.chat is None:
            raise TaskError(
                f"{where}: column {col!r} holds messages, which need a chat template, and the "
                "model has none (set task.chat_template to a template file)"
            )
        if messages[-1]["role"] == "assistant":
            raise TaskError(
                f"{where}: column {col!r}: the last message is the assistant's; a prompt ends "
                "with the turn the model answers (put the reference in the answer column)"
            )
        if self.system_prompt and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        try:
            return messages, self.chat.render(messages)
        except ValueError as e:  # model.chat.ChatTemplateError: raise_exception() or a bug
            raise TaskError(f"{where}: column {col!r}: {e}") from None

    def _answer(self, row: Row) -> object:
        data = row.data
        names = [self.columns["answer"]] if "answer" in self.columns else list(ANSWER_COLUMNS)
        truth = verl_ground_truth(data)
        if "answer" not in self.columns and truth is not MISSING:  # where verl reads it, first
            return _answer_text(truth, row.where, "reward_model.ground_truth", self.need_answer)
        for name in names:
            if name in data:
                return _answer_text(data[name], row.where, name, self.need_answer)
        if not self.need_answer:
            return None
        have = ", ".join(map(repr, data)) or "none"
        raise TaskError(
            f"{row.where}: missing column {' or '.join(map(repr, names))} (columns here: {have}; "
            "map yours with task.columns)"
        )


MISSING = object()


def verl_ground_truth(row: dict[str, Any]) -> object:
    """A verl row's ground truth, `reward_model.ground_truth`, as stored; `MISSING` if none.
    verl reads it there whatever other columns the row has (a MATH row's worked `solution`)."""
    verl = row.get("reward_model")
    return verl["ground_truth"] if isinstance(verl, dict) and "ground_truth" in verl else MISSING


def _answer_text(value: object, where: str, col: str, strict: bool = True) -> object:
    """The answer as text. `strict` (a built-in reward compares with it): a string or a number;
    else a value of another kind (a list of accepted answers, a dict of test cases, an empty
    cell) is passed as it is, as TRL and verl pass the column to a reward of your own."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        if not strict:
            return value
        raise TaskError(
            f"{where}: column {col!r}: expected a string or a number, got {type(value).__name__}"
        )
    if isinstance(value, float) and value != value:  # NaN: an empty CSV cell
        if not strict:
            return None
        raise TaskError(f"{where}: column {col!r}: empty")
    return str(value)


def _messages(value: Any, where: str, col: str) -> list[dict[str, Any]]:
    """A validated copy of a conversation: plain dicts, keys whose value is None dropped."""
    if not isinstance(value, list) or not value:
        raise TaskError(
            f"{where}: column {col!r}: expected a string or a non-empty list of "
            f"{{'role', 'content'}} messages, got {type(value).__name__}"
        )
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise TaskError(f"{where}: column {col!r}: message {i} is not an object")
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                raise TaskError(f"{where}: column {col!r}: message {i} needs a string {key!r}")
        out.append({k: v for k, v in m.items() if v is not None})
    return out


def read_prompts(
    path: str | Path, fmt: RowFormat | None = None, split: str | Split = "train"
) -> list[Prompt]:
    """The prompts of a dataset file, folder or hub id; a bad row raises `TaskError`."""
    fmt = fmt or RowFormat()
    rows = read_table(path, split)
    if not rows:
        raise TaskError(f"{path}: no rows")
    stem = Path(str(path)).stem
    prompts = [fmt.prompt(r, f"{stem}:{i}") for i, r in enumerate(rows)]
    _unique_ids(prompts, rows)
    return prompts


def _unique_ids(prompts: list[Prompt], rows: list[Row]) -> None:
    """A prompt's id keys what the run learns of it (pass rates, lengths, the replay buffer's
    successes): two rows of one id must be the same prompt, else one would get the other's."""
    first: dict[str, int] = {}
    for i, p in enumerate(prompts):
        j = first.setdefault(p.id, i)
        q = prompts[j]
        if j != i and (q.text != p.text or q.answer != p.answer):
            raise TaskError(
                f"{rows[i].where}: id {p.id!r} is also the id of {rows[j].where}, another "
                "prompt; ids must be unique (map a unique column to id with task.columns)"
            )


def read_rows(path: str | Path, template: str = "{prompt}") -> list[Prompt]:
    """Plain-text prompts of a file (no chat template), as `read_prompts`."""
    return read_prompts(path, RowFormat(template=template))


def heldout_split(n: int, fraction: float, seed: int) -> set[int]:
    """Indices of the `int(n * fraction)` rows held out (at least one of two or more rows when
    `fraction` > 0, so a small file is still evaluated), drawn with their own seed."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    k = int(n * fraction)
    if fraction > 0 and n >= 2:
        k = max(k, 1)
    return set(order[:k])


@dataclass
class DatasetTask:
    """Training prompts from a dataset; held out from a second one or a seeded split.

    The split's seed (`task.heldout_seed`) is its own, not the run's: runs of different seeds
    are evaluated on the same held-out prompts.
    """

    path: str
    reward_fn: Callable[[Prompt, str], float]
    heldout_path: str | None = None
    heldout_fraction: float = 0.1
    template: str = "{prompt}"
    seed: int = 0  # of the held-out split
    name: str = "dataset"
    fmt: RowFormat | None = None
    split: str = "train"
    heldout_split: str | None = None  # of `heldout_path`, else of `path`
    dataset_config: str | None = None  # of a hub dataset (`path`, `heldout_path`)

    def __post_init__(self) -> None:
        fmt = self.fmt or RowFormat(template=self.template)
        if self.heldout_split and not self.heldout_path and Path(self.path).is_file():
            raise TaskError(
                f"task.heldout_split: {self.path} is one file, read whole as the training rows "
                "(a split names the files of a folder or a hub dataset); hold rows out with "
                "task.heldout_fraction, or give the held-out file as task.heldout_path"
            )
        rows = read_prompts(self.path, fmt, Split(self.split, config=self.dataset_config))
        if self.heldout_path or self.heldout_split:
            source = self.heldout_path or self.path
            which = (
                "task.heldout_split"
                if self.heldout_split
                else "task.heldout_split unset: task.split"
            )
            split = Split(self.heldout_split or self.split, which, config=self.dataset_config)
            held = read_prompts(source, fmt, split)
            self._train, self._heldout = rows, held
        else:
            held_ids = heldout_split(len(rows), self.heldout_fraction, self.seed)
            self._heldout = [r for i, r in enumerate(rows) if i in held_ids]
            self._train = [r for i, r in enumerate(rows) if i not in held_ids]
        if not self._train:
            raise TaskError(f"{self.path}: no training rows left after the held-out split")

    def train_prompts(self) -> list[Prompt]:
        return self._train

    def heldout_prompts(self) -> list[Prompt]:
        return self._heldout

    def reward(self, prompt: Prompt, completion: str) -> float:
        return float(self.reward_fn(prompt, completion))


JsonlTask = DatasetTask  # the name of the JSONL-only task this generalises
