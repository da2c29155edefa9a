"""Record files, chosen by what the path is: parquet, JSONL, JSON, or a Hugging Face ``datasets`` directory.

Called by ``tasks/source.py`` when a rollout replica starts (``spec.data.prompts``, ``spec.data.validation``).
Each reader returns a ``Records`` sequence whose items are whole records (dicts with every field of the
row, nested ones as dicts and lists), made on access rather than all at once:

    a directory with state.json      ``Dataset.save_to_disk``: its Arrow files memory-mapped (zero-copy;
                                     the page cache shares them between replicas on one node)
    a directory with *.parquet       the files as one sequence (a Hub dataset's data/ folder)
    *.parquet, *.pq                  streamed by row group: only the footer is read at start, a row group
                                     is decoded when one of its rows is read (the last few are kept)
    *.json starting with ``[``       an array of objects, parsed whole (use JSONL or parquet when large)
    anything else (*.jsonl, *.json)  JSON Lines: the file memory-mapped, a line parsed when it is read

pyarrow reads the Arrow and parquet forms (as ``datasets`` itself does); ``datasets`` is not needed at run
time. A path the readers cannot use raises ``ReadError`` with the reason; the caller adds the field.
"""

from __future__ import annotations

import array
import bisect
import collections
import json
import mmap
import pathlib
from collections.abc import Iterator, Sequence
from typing import Any, overload

_BATCH = 1024
"""Rows converted to Python at a time when a table is iterated (the start-up checks)."""
_ROW_GROUPS_KEPT = 4
"""Decoded parquet row groups a reader keeps (the least recently read goes first)."""


class ReadError(ValueError):
    """The path does not hold records the readers can use."""


class Records(Sequence[dict[str, Any]]):
    """A read-only sequence of records; ``where(i)`` names record i as the error messages do."""

    path: str = ""

    def where(self, i: int) -> str:
        return f"row {i}"

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[dict[str, Any]]: ...
    def __getitem__(self, i: int | slice) -> dict[str, Any] | Sequence[dict[str, Any]]:
        if isinstance(i, slice):
            return [self.row(j) for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self.row(i % len(self))

    def row(self, i: int) -> dict[str, Any]:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError


class ListRecords(Records):
    """Records already in memory (a JSON array, a builtin task)."""

    def __init__(self, rows: list[dict[str, Any]], path: str = "") -> None:
        self.rows, self.path = rows, path

    def row(self, i: int) -> dict[str, Any]:
        return self.rows[i]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)


class ArrowRecords(Records):
    """Rows of a pyarrow Table, each converted to a dict when read."""

    def __init__(self, table: Any, path: str) -> None:
        self.table, self.path = table, path

    def row(self, i: int) -> dict[str, Any]:
        rows: list[dict[str, Any]] = self.table.slice(i, 1).to_pylist()
        return rows[0]

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.table.to_batches(max_chunksize=_BATCH):
            yield from batch.to_pylist()


class ParquetRecords(Records):
    """Parquet files read by row group: opening one reads its footer (row counts), not its data; a row
    group is decoded into Arrow when a row of it is first read, and the last ``_ROW_GROUPS_KEPT`` stay
    decoded, so a replica holds a few row groups, not the file. The rollout reads records in order (and
    the start-up checks iterate them batch by batch), so a group is decoded about once per pass."""

    def __init__(self, files: list[pathlib.Path], path: str) -> None:
        self.path = path
        self.files: list[Any] = []  # pyarrow ParquetFiles, in order
        self.groups: list[tuple[Any, int]] = []  # (ParquetFile, row group index)
        self.ends = array.array("q")  # row count up to and including each group
        total = 0
        for f in files:
            handle = _pq().ParquetFile(str(f), memory_map=True)
            self.files.append(handle)
            for g in range(handle.metadata.num_row_groups):
                total += handle.metadata.row_group(g).num_rows
                self.groups.append((handle, g))
                self.ends.append(total)
        self.decoded: collections.OrderedDict[int, Any] = collections.OrderedDict()

    def _group(self, g: int) -> Any:
        if g in self.decoded:
            self.decoded.move_to_end(g)
            return self.decoded[g]
        handle, index = self.groups[g]
        table = _arrow_call(pathlib.Path(self.path), lambda: handle.read_row_group(index))
        self.decoded[g] = table
        if len(self.decoded) > _ROW_GROUPS_KEPT:
            self.decoded.popitem(last=False)
        return table

    def row(self, i: int) -> dict[str, Any]:
        g = bisect.bisect_right(self.ends, i)
        start = self.ends[g - 1] if g else 0
        rows: list[dict[str, Any]] = self._group(g).slice(i - start, 1).to_pylist()
        return rows[0]

    def __len__(self) -> int:
        return int(self.ends[-1]) if self.ends else 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for handle in self.files:
            for batch in handle.iter_batches(batch_size=_BATCH):
                yield from batch.to_pylist()


class JsonlRecords(Records):
    """JSON Lines, memory-mapped: an index of where each non-blank line starts, a line parsed on access.
    ``where(i)`` is the line number (from 1) an editor shows."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = str(path)
        self.starts, self.lines = array.array("q"), array.array("q")
        self.map: mmap.mmap | bytes = b""
        with path.open("rb") as f:
            if path.stat().st_size:
                self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        start, number, size = 0, 1, len(self.map)
        while start < size:
            end = self.map.find(b"\n", start)
            end = size if end < 0 else end
            if self.map[start:end].strip():
                self.starts.append(start)
                self.lines.append(number)
            start, number = end + 1, number + 1

    def where(self, i: int) -> str:
        return f"line {self.lines[i]}"

    def row(self, i: int) -> dict[str, Any]:
        start = self.starts[i]
        end = self.map.find(b"\n", start)
        text = self.map[start : None if end < 0 else end]
        try:
            record = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
            raise ReadError(f"{self.path!r} {self.where(i)} is not JSON ({reason})") from None
        if not isinstance(record, dict):
            raise ReadError(f"{self.path!r} {self.where(i)} is not a JSON object")
        return record

    def __len__(self) -> int:
        return len(self.starts)


def open_records(path: pathlib.Path) -> Records:
    """The records at ``path`` (see the module docstring for which reader a path gets)."""
    if path.is_dir():
        return _directory(path)
    if not path.exists():
        raise ReadError(f"cannot read {str(path)!r} (No such file or directory)")
    if path.suffix in (".parquet", ".pq"):
        records: Records = _arrow_call(path, lambda: ParquetRecords([path], str(path)))
        return records
    try:
        if path.suffix == ".json" and _first_byte(path) == b"[":
            return _json_array(path)
        return JsonlRecords(path)
    except OSError as exc:
        raise ReadError(f"cannot read {str(path)!r} ({exc.strerror})") from None


def _directory(path: pathlib.Path) -> Records:
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
        raise ReadError(
            f"{str(path)!r} is a DatasetDict with splits {', '.join(splits) or 'none'}: "
            f"name one, e.g. {str(path / (splits[0] if splits else 'train'))!r}"
        )
    if (path / "state.json").is_file():
        return ArrowRecords(_saved_dataset(path), str(path))
    if parquet := sorted(path.glob("*.parquet")):
        records: Records = _arrow_call(path, lambda: ParquetRecords(parquet, str(path)))
        return records
    raise ReadError(
        f"{str(path)!r} is a directory without state.json (Dataset.save_to_disk) or *.parquet files"
    )


def _saved_dataset(path: pathlib.Path) -> Any:
    """A ``Dataset.save_to_disk`` directory: state.json lists its Arrow stream files, read memory-mapped
    as ``datasets.Dataset.load_from_disk`` reads them."""
    import pyarrow as pa

    try:
        state = json.loads((path / "state.json").read_text())
        files = [path / f["filename"] for f in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReadError(f"{str(path / 'state.json')!r} is not a datasets state file ({exc})") from None

    def read() -> Any:
        tables = [pa.ipc.open_stream(pa.memory_map(str(f))).read_all() for f in files]
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    return _arrow_call(path, read)


def _arrow_call(path: pathlib.Path, read: Any) -> Any:
    import pyarrow as pa

    try:
        return read()
    except (pa.ArrowException, OSError) as exc:
        raise ReadError(f"cannot read {str(path)!r} ({exc})") from None


def _pq() -> Any:
    import pyarrow.parquet as pq

    return pq


def _first_byte(path: pathlib.Path) -> bytes:
    with path.open("rb") as f:
        while chunk := f.read(4096):
            if stripped := chunk.lstrip():
                return stripped[:1]
    return b""


def _json_array(path: pathlib.Path) -> Records:
    try:
        rows = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
        raise ReadError(f"{str(path)!r} is not JSON ({reason})") from None
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ReadError(f"{str(path)!r} row {i} is not a JSON object")
    return ListRecords(rows, str(path))
