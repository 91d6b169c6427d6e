"""Datasets as users have them: every file kind, folders, column maps, chat rendering, the
held-out seed, and a one-line error naming file, row and column for every malformed case."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat_model import CHAT_TEMPLATE
from slipstream.config import ConfigError, load_config
from slipstream.model.chat import ChatTemplate
from slipstream.tasks import DatasetTask, RowFormat, TaskError, read_prompts
from slipstream.tasks.datasets import Row, Split, read_table, split_files
from slipstream.tasks.rows import heldout_split

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROWS = [
    {"problem": "1+1", "solution": "2", "level": 1},
    {"problem": "2+2", "solution": "4", "level": 3},
]
CHAT = ChatTemplate(CHAT_TEMPLATE, "test template")


def _parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.slow  # imports datasets (2 s)
def test_every_file_kind_reads_the_same_rows(tmp_path):
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    (tmp_path / "d.csv").write_text("problem,solution,level\n1+1,2,1\n2+2,4,3\n")
    _parquet(tmp_path / "d.parquet", ROWS)
    fmt = RowFormat(columns={"prompt": "problem", "answer": "solution"})
    for name in ("d.jsonl", "d.json", "d.csv", "d.parquet"):
        prompts = read_prompts(tmp_path / name, fmt)
        assert [(p.text, p.answer) for p in prompts] == [("1+1", "2"), ("2+2", "4")], name
        # every column but the prompt's travels with it, under its own name
        assert prompts[1].meta.keys() == {"solution", "level"}, name
        assert str(prompts[1].meta["solution"]) == "4" and prompts[1].meta["level"] == 3
        assert prompts[0].messages is None


def test_folder_splits(tmp_path):
    (tmp_path / "data").mkdir()
    _parquet(tmp_path / "data" / "train-00000-of-00001.parquet", ROWS)
    (tmp_path / "data" / "test.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    assert len(read_table(tmp_path, "train")) == 2
    assert [r.where.rsplit("/", 1)[1] for r in read_table(tmp_path, "test")] == ["test.jsonl:1"]
    with pytest.raises(
        TaskError, match=r"no file of split 'dev' \(task.split\); splits here: test, train"
    ):
        read_table(tmp_path, "dev")
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "a.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    (flat / "b.jsonl").write_text(json.dumps(ROWS[1]) + "\n")
    assert len(read_table(flat, "train")) == 2  # no split named: all of it is train
    fmt = RowFormat(columns={"prompt": "problem"})
    task = DatasetTask(str(tmp_path), lambda p, c: 0.0, fmt=fmt, heldout_split="test")
    assert len(task.train_prompts()) == 2 and len(task.heldout_prompts()) == 1


def test_a_folder_under_a_hidden_folder_keeps_its_files(tmp_path, monkeypatch):
    """Hidden files are skipped inside the folder only: a dataset under `~/.cache` or named
    `../data` read as empty before (the check looked at every part of the absolute path)."""
    data = tmp_path / ".cache" / "ds"
    data.mkdir(parents=True)
    (data / "a.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    (data / ".b.jsonl").write_text(json.dumps(ROWS[1]) + "\n")
    assert [f.name for f in split_files(data, "train")] == ["a.jsonl"]
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert len(read_table("../.cache/ds", "train")) == 1


def test_a_downloaded_hub_dataset_folder_reads_the_config_it_is_told(tmp_path):
    """openai/gsm8k downloaded as a folder holds `main/` and `socratic/`, each with its train
    and test files. task.dataset_config was ignored for folders: the train split read both
    configs' rows, mixed. Now the config picks its folder, and without one the mix is an
    error; one data folder, or split-named folders, stay as they were."""
    for config in ("main", "socratic"):
        (tmp_path / config).mkdir()
        for split in ("train", "test"):
            (tmp_path / config / f"{split}-00000-of-00001.jsonl").write_text(
                json.dumps({"prompt": f"{config} {split}", "answer": "1"}) + "\n"
            )
    rows = read_table(tmp_path, Split("test", config="socratic"))
    assert [r.data["prompt"] for r in rows] == ["socratic test"]
    with pytest.raises(TaskError, match=r"several folders \(main, socratic\).*dataset_config"):
        read_table(tmp_path, "train")
    with pytest.raises(TaskError, match=r"no folder 'default' .*folders: main, socratic"):
        read_table(tmp_path, Split("train", config="default"))
    task = DatasetTask(str(tmp_path), lambda p, c: 0.0, heldout_split="test", dataset_config="main")
    assert [p.text for p in task.train_prompts()] == ["main train"]
    assert [p.text for p in task.heldout_prompts()] == ["main test"]


def test_a_hub_shards_name_is_its_split_as_datasets_reads_it(tmp_path):
    """The hub names a shard `data/{split}-00000-of-00001.*`: `datasets` reads
    `train_sft-...` as split `train_sft`. Its words made it a `train` file, so task.split=train
    mixed train_sft and train_gen rows, train_sft was no split at all, and shards of no usual
    split name (OpenMathReasoning's cot, tir) were all read as `train`."""
    (tmp_path / "data").mkdir()
    for split in ("train_sft", "train_gen", "test_sft"):
        (tmp_path / "data" / f"{split}-00000-of-00001-3f2a.jsonl").write_text(
            json.dumps({"prompt": split, "answer": "1"}) + "\n"
        )
    assert [r.data["prompt"] for r in read_table(tmp_path, "train_sft")] == ["train_sft"]
    with pytest.raises(
        TaskError, match=r"no file of split 'train' .*test_sft, train_gen, train_sft"
    ):
        read_table(tmp_path, "train")
    other = tmp_path / "other"
    (other / "data").mkdir(parents=True)
    for split in ("cot", "tir"):
        (other / "data" / f"{split}-00000-of-00002.jsonl").write_text(
            json.dumps({"prompt": split, "answer": "1"}) + "\n"
        )
    with pytest.raises(TaskError, match=r"no file of split 'train' .*splits here: cot, tir"):
        read_table(other, "train")
    assert [r.data["prompt"] for r in read_table(other, "tir")] == ["tir"]


def test_a_save_to_disk_folder_is_its_arrow_shards(tmp_path):
    # DatasetDict.save_to_disk's layout: the JSON files beside the shards are metadata, which
    # were read as rows ("dataset_info.json: row 0: missing column 'messages' or 'prompt'")
    for split in ("train", "test"):
        (tmp_path / split).mkdir()
        for name in ("data-00000-of-00001.arrow", "dataset_info.json", "state.json"):
            (tmp_path / split / name).write_text("{}")
    (tmp_path / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    got = [f.relative_to(tmp_path).as_posix() for f in split_files(tmp_path, "test")]
    assert got == ["test/data-00000-of-00001.arrow"]
    one = tmp_path / "train"  # Dataset.save_to_disk: one split, no split named in the path
    assert [f.name for f in split_files(one, "train")] == ["data-00000-of-00001.arrow"]
    (tmp_path / "rows").mkdir()  # without .arrow shards a state.json is a file of rows
    (tmp_path / "rows" / "state.json").write_text("[]")
    assert [f.name for f in split_files(tmp_path / "rows", "train")] == ["state.json"]


def test_messages_rows_are_rendered_with_the_template_and_system_prompt(tmp_path):
    f = _parquet(
        tmp_path / "m.parquet",
        [{"messages": [{"role": "user", "content": "What is 2+3?"}], "answer": "5"}],
    )
    [p] = read_prompts(f, RowFormat(chat=CHAT, system_prompt="Be brief."))
    assert p.text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert p.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+3?"},
    ]
    # a plain prompt with a chat template is the one user turn; without one, plain text
    row = Row("x:1", {"prompt": "hi", "answer": 1})
    assert (
        RowFormat(chat=CHAT)
        .prompt(row, "0")
        .text.endswith("user\nhi<|im_end|>\n<|im_start|>assistant\n")
    )
    assert RowFormat(template="Q: {prompt}\nA:").prompt(row, "0").text == "Q: hi\nA:"


def test_verl_rows(tmp_path):
    row = {
        "data_source": "gsm8k",
        "prompt": [{"role": "user", "content": "2+2?"}],
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {"index": 7},
    }
    [p] = read_prompts(_parquet(tmp_path / "v.parquet", [row]), RowFormat(chat=CHAT))
    assert p.answer == "4" and p.meta["data_source"] == "gsm8k"
    assert p.meta["extra_info"] == {"index": 7}


def test_heldout_split_has_its_own_seed(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": i}) + "\n" for i in range(50)))
    a = DatasetTask(str(f), lambda p, c: 0.0, heldout_fraction=0.2, seed=0)
    b = DatasetTask(str(f), lambda p, c: 0.0, heldout_fraction=0.2, seed=0)
    c = DatasetTask(str(f), lambda p, c: 0.0, heldout_fraction=0.2, seed=1)
    ids = lambda t: [p.id for p in t.heldout_prompts()]  # noqa: E731
    assert ids(a) == ids(b) and len(ids(a)) == 10 and ids(a) != ids(c)
    assert heldout_split(50, 0.2, 0) == heldout_split(50, 0.2, 0)
    # 9 rows at the default 0.1 held none out, and evaluation reported 0 on no prompts
    assert len(heldout_split(9, 0.1, 0)) == 1 and len(heldout_split(55, 0.1, 0)) == 5
    assert heldout_split(9, 0.0, 0) == set() and heldout_split(1, 0.1, 0) == set()
    # run.seed does not move the split: setup passes task.heldout_seed
    cfg = load_config(None, [f"task.path={f}", "run.seed=5"])
    assert cfg.task.heldout_seed == 0


def test_path_selects_the_dataset_kind_or_conflicts():
    assert load_config(None, ["task.path=/no/such.jsonl"]).task.kind == "dataset"
    with pytest.raises(ConfigError, match=r"task\.kind: 'builtin'.*task\.path"):
        load_config(None, ["task.path=/no/such.jsonl", 'task.kind="builtin"'])
    with pytest.raises(ConfigError, match=r"unknown key 'task\.colums'"):
        load_config(None, ["task.path=x.jsonl", "task.colums={}"])


@pytest.mark.slow  # imports datasets (2 s)
def test_arrow_rows_are_the_rows_datasets_iterates(tmp_path):
    """Consistency check: Parquet rows, now formatted a batch at a time (`table_rows`), are
    those `datasets`' own row by row iteration gives, nested and missing values included, for
    more rows than one batch."""
    import datasets

    from slipstream.tasks.datasets import read_arrow

    rows = [
        {"p": f"q{i}", "n": i if i % 7 else None, "xs": list(range(i % 3)), "s": {"a": i % 2}}
        for i in range(2500)
    ]
    f = _parquet(tmp_path / "d.parquet", rows)
    want = [dict(r) for r in datasets.Dataset.from_parquet(str(f), keep_in_memory=True)]
    got = read_arrow(f)
    assert [r.data for r in got] == want == rows
    assert got[2499].where == f"{f}: row 2499"


def test_missing_datasets_library_names_the_install(tmp_path, monkeypatch):
    f = _parquet(tmp_path / "d.parquet", ROWS)
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(TaskError, match=r"pip install 'slipstream\[data\]'"):
        read_table(f)


@pytest.mark.slow
def test_hub_id_offline_is_one_clear_line(monkeypatch):
    datasets = pytest.importorskip("datasets")
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # as HF_HUB_OFFLINE=1 does
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(TaskError) as err:
        read_table("no-such-owner/no-such-dataset", "train")
    msg = str(err.value)
    assert msg.startswith("no-such-owner/no-such-dataset: no such local file or folder")
    assert "\n" not in msg


MALFORMED = [
    ({"answer": "1"}, "missing column 'messages' or 'prompt'"),
    ({"prompt": "x"}, "missing column 'answer' or 'ground_truth' or 'solution'"),
    ({"prompt": "", "answer": "1"}, "column 'prompt': empty prompt"),
    ({"prompt": 3, "answer": "1"}, "column 'prompt': expected a string or a non-empty list"),
    ({"prompt": "x", "answer": [1]}, "column 'answer': expected a string or a number"),
    ({"messages": [], "answer": "1"}, "column 'messages': expected a string or a non-empty list"),
    ({"messages": ["hi"], "answer": "1"}, "column 'messages': message 0 is not an object"),
    ({"messages": [{"role": "user"}], "answer": "1"}, "column 'messages': message 0 needs a string 'content'"),
    (
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "answer": "1"},
        "column 'messages': the last message is the assistant's",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("row", "message"), MALFORMED)
def test_malformed_rows_name_file_row_and_column(tmp_path, row, message):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"prompt": "ok", "answer": "1"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(TaskError) as err:
        read_prompts(f, RowFormat(chat=CHAT))
    assert str(err.value).startswith(f"{f}:2: {message}"), str(err.value)
    g = tmp_path / "d.json"  # the same row in a JSON array is named by its index
    g.write_text(json.dumps([{"prompt": "ok", "answer": "1"}, row]))
    with pytest.raises(TaskError, match=f"^{g}: row 1: "):
        read_prompts(g, RowFormat(chat=CHAT))


def test_malformed_parquet_and_csv_name_file_and_row(tmp_path):
    f = _parquet(
        tmp_path / "d.parquet", [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": None}]
    )
    with pytest.raises(
        TaskError, match=rf"^{f}: row 1: missing column 'answer'|^{f}: row 1: column 'answer'"
    ):
        read_prompts(f)
    c = tmp_path / "d.csv"
    c.write_text("question,answer\nq,1\n")
    with pytest.raises(
        TaskError,
        match=rf"^{c}: row 0: missing column 'messages' or 'prompt' \(columns here: 'question', 'answer'",
    ):
        read_prompts(c)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(TaskError, match=rf"^{bad}: cannot be read as parquet"):
        read_prompts(bad)
    with pytest.raises(TaskError, match="messages, which need a chat template"):
        read_prompts(
            _parquet(
                tmp_path / "m.parquet",
                [{"messages": [{"role": "user", "content": "q"}], "answer": "1"}],
            )
        )


value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
message = st.fixed_dictionaries(
    {}, optional={"role": st.sampled_from(["user", "system", "assistant", 3]), "content": value}
)
row = st.dictionaries(
    st.sampled_from(["prompt", "messages", "answer", "solution", "id", "other"]),
    value | st.lists(message, max_size=3) | st.text(max_size=8),
    max_size=5,
)


@pytest.mark.slow
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=st.lists(row, min_size=1, max_size=4), chat=st.booleans())
def test_fuzzed_rows_fail_only_with_one_line_naming_the_row(tmp_path, rows, chat):
    f = tmp_path / "d.jsonl"
    f.write_text(
        "\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8", errors="surrogatepass"
    )
    try:
        prompts = read_prompts(f, RowFormat(chat=CHAT if chat else None))
    except TaskError as e:
        msg = str(e)
        assert msg.startswith(f"{f}:"), msg
        assert "\n" not in msg, repr(msg)
    else:
        for p in prompts:
            assert isinstance(p.text, str) and p.text and isinstance(p.answer, str)
            p.text.encode("utf-8")
            assert (p.messages is not None) == chat


def test_a_reward_of_your_own_takes_an_answer_column_of_any_kind(tmp_path):
    # only the built-in rewards compare with a string answer; a TRL/verl reward of your own gets
    # the column as the row has it: accepted answers, test cases, an empty cell
    rows = [
        {"prompt": "a", "answer": ["4", "four"]},
        {"prompt": "b", "answer": {"inputs": [1], "outputs": [2]}},
        {"prompt": "c", "answer": None},
        {"prompt": "d", "reward_model": {"ground_truth": [1, 2]}},
    ]
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = read_prompts(f, RowFormat(need_answer=False))
    assert [p.answer for p in prompts] == [
        ["4", "four"],
        {"inputs": [1], "outputs": [2]},
        None,
        [1, 2],
    ]
    assert prompts[0].meta["answer"] == ["4", "four"]
    with pytest.raises(TaskError, match="column 'answer': expected a string or a number"):
        read_prompts(f, RowFormat(need_answer=True))


def test_a_heldout_split_of_one_file_is_an_error_not_the_training_rows(tmp_path):
    """One file holds one split: `heldout_split="test"` read it whole, so every held-out row
    was also a training row."""
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    fmt = RowFormat(columns={"prompt": "problem"})
    with pytest.raises(TaskError, match=r"task.heldout_split: .* is one file.*heldout_fraction"):
        DatasetTask(str(path), lambda p, c: 0.0, fmt=fmt, heldout_split="test")
    held = tmp_path / "test.jsonl"  # the split of a given held-out file is its own business
    held.write_text(json.dumps(ROWS[0]) + "\n")
    task = DatasetTask(str(path), lambda p, c: 0.0, fmt=fmt, heldout_split="test",
                       heldout_path=str(held))  # fmt: skip
    assert len(task.train_prompts()) == len(ROWS) and len(task.heldout_prompts()) == 1


def test_a_held_out_folder_without_the_split_names_the_setting_that_asked(tmp_path):
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / "train.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    fmt = RowFormat(columns={"prompt": "problem"})
    with pytest.raises(TaskError, match=r"no file of split 'test' \(task.heldout_split\)"):
        DatasetTask(str(path), lambda p, c: 0.0, fmt=fmt, heldout_split="test",
                    heldout_path=str(tmp_path / "held"))  # fmt: skip
    # unset, the held-out folder's split is task.split's: the message names what to set
    (tmp_path / "held" / "train.jsonl").rename(tmp_path / "held" / "test.jsonl")
    with pytest.raises(TaskError) as err:
        DatasetTask(str(path), lambda p, c: 0.0, fmt=fmt, heldout_path=str(tmp_path / "held"))
    assert "no file of split 'train' (task.heldout_split unset: task.split); splits here: test" in (
        str(err.value)
    )


def test_a_hub_dataset_is_loaded_with_its_config_name(monkeypatch):
    """`task.dataset_config` reaches `load_dataset(path, name, split=...)` (openai/gsm8k needs
    `main`); a config error from the hub names the setting."""
    from types import SimpleNamespace

    import slipstream.tasks.datasets as d

    calls = []

    class Table:  # what read_hub reads of a `datasets.Dataset`: batches of columns
        def iter(self, batch_size):
            yield {"question": ["1+1"], "answer": ["2"]}

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        if config is None:
            raise ValueError("Config name is missing. Please pick one among ['main', 'socratic']")
        return Table()

    monkeypatch.setattr(d, "_datasets", lambda: SimpleNamespace(load_dataset=load_dataset))
    fmt = RowFormat(columns={"prompt": "question"})
    task = DatasetTask("openai/gsm8k", lambda p, c: 0.0, fmt=fmt, heldout_split="test",
                       dataset_config="main")  # fmt: skip
    assert calls == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]
    assert [p.text for p in task.heldout_prompts()] == ["1+1"]
    with pytest.raises(TaskError, match=r"Config name is missing.*task.dataset_config"):
        read_table("openai/gsm8k", "train")
    cfg = load_config(None, ["task.path=openai/gsm8k", 'task.dataset_config="main"'])
    assert cfg.task.dataset_config == "main"


def test_chat_template_none_is_named_as_the_users_choice_not_the_models_lack(tmp_path):
    """The model may well have a template: `task.chat_template = 'none'` turned it off."""
    from slipstream.run.setup import row_format

    f = _parquet(tmp_path / "m.parquet", [{"messages": [{"role": "user", "content": "q"}]}])
    off = ['task.chat_template="none"']
    with pytest.raises(TaskError) as e:
        read_prompts(f, row_format(load_config(None, off)))
    assert str(e.value) == (
        f"{f}: row 0: task.chat_template = 'none' cannot render 'messages' rows; use 'auto' "
        "or a template file"
    )


@pytest.mark.parametrize(
    ("text", "line", "cause"),
    [
        ('[\n  {"prompt": "a", "answer": "1"},\n  {"prompt": "b", "answer": "2"},\n]\n', 4, ""),
        ('[\n  {"prompt": "a", "answer": "1"}\n  {"prompt": "b", "answer": "2"}\n]\n', 3, "','"),
        ('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": 2\n', 2, "','"),  # JSON lines
    ],
)
def test_a_bad_json_file_is_named_at_the_line_of_its_error(tmp_path, text, line, cause):
    # a pretty-printed array with a stray or missing comma was read as JSON lines and named at
    # its line 1 ("[": Expecting value), not where the error is
    f = tmp_path / "d.json"
    f.write_text(text)
    with pytest.raises(TaskError, match=rf"^{f}:{line}: not valid JSON \(.*{cause}"):
        read_prompts(f)


def test_two_prompts_of_one_id_are_an_error_naming_both_rows(tmp_path):
    # the id keys pass rates, lengths and the replay buffer's successes: a second prompt under
    # the same id would be trained on the first one's stored completions
    f = tmp_path / "d.jsonl"
    rows = [
        {"id": 7, "prompt": "1+1", "answer": "2"},
        {"id": 8, "prompt": "2+2", "answer": "4"},
        {"id": 7, "prompt": "1+1", "answer": "2"},  # the same prompt again: harmless
        {"id": "7", "prompt": "3+3", "answer": "6"},
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TaskError, match=rf"^{f}:4: id '7' is also the id of {f}:1, another"):
        read_prompts(f)
    f.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    assert [p.id for p in read_prompts(f)] == ["7", "8", "7"]
