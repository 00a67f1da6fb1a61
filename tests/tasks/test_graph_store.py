"""write_graph: a batch's graph rows replace what the lake held for its paths, any batch size."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from ctxlake.schemas.tables import DEFINITIONS, IMPORTS, REFERENCES
from ctxlake.tasks.graph_store import open_graph, write_graph


def _rows(paths: list[str], tag: str) -> tuple[pa.Table, pa.Table, pa.Table]:
    defs = pa.Table.from_pylist([
        {"source": "project", "path": p, "qualname": f"{tag}_{i}", "name": f"{tag}_{i}", "kind": "function",
         "start_line": 1, "end_line": 2, "signature": f"def {tag}_{i}():", "doc": None, "parent": None}
        for i, p in enumerate(paths)], schema=DEFINITIONS)
    refs = pa.Table.from_pylist([
        {"source": "project", "path": p, "line": 2, "name": f"use_{tag}", "enclosing": None, "kind": "call"}
        for p in paths for _ in range(2)], schema=REFERENCES)  # the same fact twice: stored once
    imports = pa.Table.from_pylist([
        {"source": "project", "path": p, "module": f"mod_{tag}", "resolved": None} for p in paths], schema=IMPORTS)
    return defs, refs, imports


@pytest.mark.parametrize("changed", [3, 12, 40])
def test_a_batch_replaces_its_paths_rows_and_leaves_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, changed: int
) -> None:
    tables = open_graph(tmp_path / "lake")
    everything = [f"pkg/m{i}.py" for i in range(60)]
    assert write_graph(tables, "project", _rows(everything, "old"), everything, cold=True) == 60 * 3

    def no_merge(*args: object, **kwargs: object) -> None:
        # A merge joins against every row of the table (+0.73 GB: docs/measurements/indexing.md,
        # "One big repository").
        raise AssertionError("write_graph merged")

    for table in tables:
        monkeypatch.setattr(type(table), "merge_insert", no_merge)
    batch = everything[:changed]
    kept, gone = batch[: changed // 2], batch[changed // 2 :]  # the rest of the batch was removed
    write_graph(tables, "project", _rows(kept, "new"), batch, cold=False)

    defs = tables.definitions.to_arrow().to_pylist()
    by_path = {r["path"]: r["name"] for r in defs}
    assert len(defs) == len(by_path) == 60 - len(gone)
    assert all(by_path[p].startswith("new_") for p in kept)
    assert not set(gone) & set(by_path)
    assert all(by_path[p].startswith("old_") for p in everything[changed:])
    refs = tables.refs.to_arrow().to_pylist()
    assert sorted(r["path"] for r in refs if r["name"] == "use_new") == sorted(kept)
    assert tables.imports.count_rows("module = 'mod_old'") == 60 - changed
