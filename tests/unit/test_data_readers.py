"""Prompt files in every format (data/readers.py via tasks/source.py), dotted keys (data/fields.py) and
malformed rows named by file, row and field. The files are written by the libraries that write them for
verl users: pyarrow (verl's data preprocessing writes parquet through pandas/datasets) and ``datasets``."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from asyncrl_workloads.data import fields, readers
from asyncrl_workloads.tasks import source

GSM8K_ROWS = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"What is {n} + {n}? Let's think step by step."}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(2 * n)},
        "extra_info": {"split": "train", "index": n, "answer": f"{n} + {n} = {2 * n} #### {2 * n}"},
    }
    for n in range(5)
]
"""verl's examples/data_preprocess/gsm8k.py row layout."""


def _write(tmp_path: pathlib.Path, kind: str, rows: list[dict[str, Any]]) -> pathlib.Path:
    if kind == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path := tmp_path / "train.parquet", row_group_size=2)
    elif kind == "parquet-dir":
        (path := tmp_path / "data").mkdir()
        pq.write_table(pa.Table.from_pylist(rows[:2]), path / "train-00000-of-00002.parquet")
        pq.write_table(pa.Table.from_pylist(rows[2:]), path / "train-00001-of-00002.parquet")
    elif kind == "datasets":
        import datasets

        datasets.Dataset.from_list(rows).save_to_disk(str(path := tmp_path / "saved"), num_shards=2)
    elif kind == "jsonl":
        (path := tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n\n" for r in rows))
    elif kind == "json":
        (path := tmp_path / "train.json").write_text(json.dumps(rows, indent=1))
    elif kind == "json-lines":  # datasets' Dataset.to_json writes JSON Lines under a .json name
        import datasets

        datasets.Dataset.from_list(rows).to_json(str(path := tmp_path / "lines.json"))
    return path


FORMATS = ["parquet", "parquet-dir", "datasets", "jsonl", "json", "json-lines"]


@pytest.mark.parametrize("kind", FORMATS)
def test_every_format_reads_verl_rows_whole(tmp_path: pathlib.Path, kind: str) -> None:
    path = _write(tmp_path, kind, GSM8K_ROWS)
    records = source.load_prompts(
        str(path), "prompt", chat=True, required={"reward_model.ground_truth": "spec.reward.groundTruthKey"}
    )
    assert len(records) == len(GSM8K_ROWS)
    assert list(records) == GSM8K_ROWS  # every field kept, nested ones as dicts and lists
    assert records[3] == GSM8K_ROWS[3] and records[-1] == GSM8K_ROWS[-1]
    assert [r["data_source"] for r in records[1:3]] == ["openai/gsm8k"] * 2
    with pytest.raises(IndexError):
        records[len(GSM8K_ROWS)]


def test_a_saved_dataset_is_memory_mapped_not_copied(tmp_path: pathlib.Path) -> None:
    path = _write(tmp_path, "datasets", GSM8K_ROWS * 200)
    before = pa.total_allocated_bytes()
    records = readers.open_records(path)
    assert isinstance(records, readers.ArrowRecords) and records.table.nbytes > 50_000
    assert records[777] == GSM8K_ROWS[777 % 5]
    assert pa.total_allocated_bytes() - before < 4096  # the table's buffers are the mapped file's


def test_parquet_is_streamed_by_row_group(tmp_path: pathlib.Path) -> None:
    """Opening reads the footers only; a row decodes its row group; a few groups stay decoded; a folder of
    files is one sequence in file order."""
    rows = [{"prompt": f"q{i}", "reward_model": {"ground_truth": str(i)}} for i in range(35)]
    folder = tmp_path / "data"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:25]), folder / "a.parquet", row_group_size=10)  # 10, 10, 5
    pq.write_table(pa.Table.from_pylist(rows[25:]), folder / "b.parquet", row_group_size=10)  # 10
    records = readers.open_records(folder)
    assert isinstance(records, readers.ParquetRecords) and len(records) == 35 and not records.decoded
    assert [records[i] for i in (0, 9, 10, 24, 25, 34, -1)] == [rows[i] for i in (0, 9, 10, 24, 25, 34, -1)]
    assert len(records.decoded) == readers._ROW_GROUPS_KEPT  # 4 groups touched, the 4 newest kept
    for i in range(35):
        assert records[i] == rows[i]
    assert len(records.decoded) <= readers._ROW_GROUPS_KEPT and list(records) == rows
    assert list(readers.open_records(folder / "a.parquet")) == rows[:25]


def test_jsonl_is_read_a_line_at_a_time(tmp_path: pathlib.Path) -> None:
    records = readers.open_records(_write(tmp_path, "jsonl", GSM8K_ROWS))
    assert isinstance(records, readers.JsonlRecords)
    assert [records.where(i) for i in range(3)] == ["line 1", "line 3", "line 5"]  # blank lines skipped


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("reward_model.ground_truth", "6"),
        ("extra_info.index", 3),
        ("prompt.0.role", "user"),
        ("prompt.1.role", fields.MISSING),
        ("reward_model.nope", fields.MISSING),
        ("ability.x", fields.MISSING),
        ("a.b", "the top-level field named a.b wins"),
    ],
)
def test_dotted_keys_walk_nested_fields(key: str, expected: Any) -> None:
    record = {**GSM8K_ROWS[3], "a.b": "the top-level field named a.b wins", "a": {"b": "nested"}}
    assert fields.lookup(record, key) == expected
    assert fields.get(record, key, "dflt") == ("dflt" if expected is fields.MISSING else expected)


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_dotted_prompt_key(tmp_path: pathlib.Path, kind: str) -> None:
    rows = [{"question": {"text": f"q{i}"}, "answer": i} for i in range(3)]
    records = source.load_prompts(str(_write(tmp_path, kind, rows)), "question.text")
    assert [fields.require(r, "question.text") for r in records] == ["q0", "q1", "q2"]


WHERE = {"parquet": "row 3", "datasets": "row 3", "jsonl": "line 7", "json": "row 3"}
"""Record 3 of each file: tables count rows from 0 (as pandas and datasets do), JSONL its lines from 1 (as
editors do; _write puts a blank line after each record)."""


@pytest.mark.parametrize("kind", WHERE)
def test_a_record_without_its_reference_names_file_row_and_field(tmp_path: pathlib.Path, kind: str) -> None:
    rows = [dict(r) for r in GSM8K_ROWS]
    rows[3]["reward_model"] = {"style": "rule"}  # parquet stores the absent field as null
    path = _write(tmp_path, kind, rows)
    with pytest.raises(source.PromptSourceError) as err:
        source.load_prompts(
            str(path), chat=True, required={"reward_model.ground_truth": "spec.reward.groundTruthKey"}
        )
    assert str(err.value) == (
        f"spec.data.prompts: {str(path)!r} {WHERE[kind]}: field 'reward_model.ground_truth' is missing "
        "(spec.reward.groundTruthKey)"
    )


@pytest.mark.parametrize("kind", WHERE)
def test_a_record_whose_prompt_is_not_one_names_file_row_and_field(tmp_path: pathlib.Path, kind: str) -> None:
    rows = [{"q": {"text": "hi"}} for _ in range(5)]
    rows[3] = {"q": {"text": None}}
    path = _write(tmp_path, kind, rows)
    with pytest.raises(source.PromptSourceError) as err:
        source.load_prompts(str(path), "q.text", "spec.data.validation", chat=True)
    assert str(err.value) == (
        f"spec.data.validation: {str(path)!r} {WHERE[kind]}: field 'q.text' must be a string or a list of "
        "{role, content} messages, got null"
    )


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.jsonl", '{"prompt": "a"}\n{bad\n', "'{path}' line 2 is not JSON (Expecting property name"),
        ("bad.jsonl", '{"prompt": "a"}\n\n[1]\n', "'{path}' line 3 is not a JSON object"),
        ("bad.json", '[{"prompt": "a"}, 2]', "'{path}' row 1 is not a JSON object"),
        ("bad.json", '[{"prompt": "a"},', "'{path}' is not JSON (Expecting value)"),
        ("bad.parquet", "not parquet", "cannot read '{path}' ("),
        ("empty.jsonl", "", "'{path}' holds no prompts"),
        ("missing.parquet", None, "cannot read '{path}' (No such file or directory)"),
    ],
)
def test_unreadable_files_name_the_file(
    tmp_path: pathlib.Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(source.PromptSourceError) as err:
        source.load_prompts(str(path))
    assert str(err.value).startswith("spec.data.prompts: " + message.format(path=path))


def test_directories_the_readers_cannot_use(tmp_path: pathlib.Path) -> None:
    import datasets

    splits = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(GSM8K_ROWS), "test": datasets.Dataset.from_list(GSM8K_ROWS)}
    )
    splits.save_to_disk(str(tmp_path / "gsm8k"))
    with pytest.raises(source.PromptSourceError) as err:
        source.load_prompts(str(tmp_path / "gsm8k"))
    assert str(err.value) == (
        f"spec.data.prompts: {str(tmp_path / 'gsm8k')!r} is a DatasetDict with splits test, train: "
        f"name one, e.g. {str(tmp_path / 'gsm8k' / 'test')!r}"
    )
    assert len(source.load_prompts(str(tmp_path / "gsm8k" / "train"), chat=True)) == len(GSM8K_ROWS)
    (tmp_path / "empty").mkdir()
    with pytest.raises(source.PromptSourceError, match="without state.json"):
        source.load_prompts(str(tmp_path / "empty"))


def test_the_judge_and_the_chat_prompt_read_dotted_keys() -> None:
    from asyncrl_api import task as task_api
    from asyncrl_workloads.episode import chat
    from asyncrl_workloads.rewards import judge

    record = {**GSM8K_ROWS[2], "q": {"messages": GSM8K_ROWS[2]["prompt"]}}
    spec = task_api.JudgeSpec(
        template="{prompt} | {reference} | {response}", referenceKey="reward_model.ground_truth"
    )
    messages = judge.build_messages(spec, record, "4", None, "q.messages")
    assert messages == [{"role": "user", "content": "What is 2 + 2? Let's think step by step. | 4 | 4"}]
    assert chat.messages_of(record, "q.messages") == GSM8K_ROWS[2]["prompt"]
    with pytest.raises(KeyError, match="q.nope"):
        chat.messages_of(record, "q.nope")
