"""The docs reader (docs_index / docs_content): listing, chunking, bounds, and the FR-05 path-safety cases."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from helpers import write_files
from mcp import Client
from mcp_helpers import PROJECT, call_error, call_ok

from ctxlake.errors import ConfigError, InputError
from ctxlake.schemas.config import DocsSettings, load_settings
from ctxlake.serve.api.docs import DocsReader, clean_relative
from ctxlake.serve.mcp.server import build_server


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "shop"
    write_files(root, PROJECT)
    (root / ".ctx").mkdir()
    return root


def reader(root: Path, **docs: object) -> DocsReader:
    return DocsReader(root, DocsSettings(**docs))  # type: ignore[arg-type]


def test_index_lists_allowed_files_with_metadata(project: Path) -> None:
    index = reader(project).index()
    assert index.sources == ["docs"]
    # The root README is listed first, by its name; then the docs folders' files.
    assert [d.path for d in index.documents] == ["README.md", "docs/billing.md", "docs/guide/install.rst",
                                                 "docs/notes.txt"]
    billing = index.documents[1]
    assert billing.name == "billing.md" and billing.sizeBytes == len(PROJECT["docs/billing.md"].encode())
    assert billing.modifiedAt.endswith("+00:00") and index.total == 4 and index.next_cursor is None
    assert reader(project).index("docs").documents[0].path == "docs/billing.md"  # no root docs in a filter
    # conf.py sits in docs/ but is not a document type.
    assert all(not d.path.endswith(".py") for d in index.documents)


def test_index_pages_with_an_opaque_cursor(project: Path) -> None:
    write_files(project, {f"docs/many/page{i:03}.md": f"# {i}\n" for i in range(450)})
    docs = reader(project)  # 450 pages, 3 other docs and the root README
    first = docs.index()
    assert len(first.documents) == 200 and first.total == 454 and first.next_cursor
    second = docs.index(cursor=first.next_cursor)
    third = docs.index(cursor=second.next_cursor)
    seen = [d.path for page in (first, second, third) for d in page.documents]
    assert len(seen) == len(set(seen)) == 454 and third.next_cursor is None
    with pytest.raises(InputError, match="invalid cursor"):
        docs.index(cursor="not-a-cursor!")
    with pytest.raises(InputError, match="another listing"):
        docs.index(source="docs", cursor=first.next_cursor)  # a cursor of the unfiltered listing


def test_sources_unknown_and_missing_folders(project: Path) -> None:
    write_files(project, {"handbook/intro.md": "# Hi\n"})
    docs = reader(project, paths=["docs", "handbook", "nowhere"])
    assert [d.path for d in docs.index(source="handbook").documents] == ["handbook/intro.md"]
    assert any("'nowhere' does not exist" in w for w in docs.index().warnings)
    with pytest.raises(InputError, match="unknown docs source 'blog'") as err:
        docs.index(source="blog")
    assert "docs, handbook, nowhere" in str(err.value)
    with pytest.raises(ConfigError, match="path traversal"):
        reader(project, paths=["../elsewhere"])
    for itself in (".", "./", "./."):  # was "empty docs folder: '.'" (it is not empty)
        with pytest.raises(ConfigError, match="is the project itself") as refused:
            reader(project, paths=[itself])
        assert "top-level documents" in (refused.value.hint or "")


def test_content_in_chunks_of_at_most_500_lines(project: Path) -> None:
    write_files(project, {"docs/long.md": "".join(f"line {i}\n" for i in range(1, 1203))})
    docs = reader(project)
    first = docs.content("docs/long.md")
    assert (first.chunk, first.totalChunks, first.totalLines) == (1, 3, 1202)
    assert (first.startLine, first.endLine) == (1, 500) and first.content.splitlines()[-1] == "line 500"
    last = docs.content("docs/long.md", chunk=3)
    assert (last.startLine, last.endLine) == (1001, 1202) and last.content.endswith("line 1202\n")
    with pytest.raises(InputError, match="chunk 4 is out of range") as err:
        docs.content("docs/long.md", chunk=4)
    assert "1..3" in str(err.value)


def test_long_lines_bound_a_chunk_by_characters(project: Path) -> None:
    line = "x" * 9_000 + "\n"
    write_files(project, {"docs/wide.md": line * 20, "docs/one-line.md": "y" * 100_000})
    docs = DocsReader(project, DocsSettings(), max_chars=40_000)
    wide = docs.content("docs/wide.md")
    assert len(wide.content) <= 20_000 and wide.totalChunks == 10
    huge = docs.content("docs/one-line.md")
    assert len(huge.content) == 20_000 and "cut" in huge.warnings[0]


def test_broken_encoding_is_read_with_a_warning(project: Path) -> None:
    (project / "docs" / "latin1.md").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    doc = reader(project).content("docs/latin1.md")
    assert doc.content == "caf\ufffd cr\ufffdme\n" and "not valid UTF-8" in doc.warnings[0]
    (project / "docs" / "blob.md").write_bytes(b"\x00\x01binary")
    with pytest.raises(InputError, match="not a text file"):
        reader(project).content("docs/blob.md")


# -- FR-05: every way out of the docs folder is refused with a clear error --------------------------


def test_fr05_relative_traversal(project: Path) -> None:
    with pytest.raises(InputError, match=r"path traversal not allowed: '\.\./\.\./\.\./etc/passwd'"):
        reader(project).content("../../../etc/passwd")


def test_fr05_absolute_path(project: Path) -> None:
    with pytest.raises(InputError, match="absolute path not allowed: '/etc/passwd'"):
        reader(project).content("/etc/passwd")


def test_fr05_traversal_after_the_folder_name(project: Path) -> None:
    with pytest.raises(InputError, match=r"path traversal not allowed: 'docs/\.\./\.\./x'"):
        reader(project).content("docs/../../x")


def test_fr05_wrong_extension(project: Path) -> None:
    with pytest.raises(InputError, match=r"file type not allowed: 'docs/conf\.py'"):
        reader(project).content("docs/conf.py")


def test_fr05_symlink_pointing_out(project: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.md"
    secret.write_text("# do not serve\n")
    os.symlink(secret, project / "docs" / "link.md")
    docs = reader(project)
    with pytest.raises(InputError, match="resolves outside docs/"):
        docs.content("docs/link.md")
    assert "docs/link.md" not in [d.path for d in docs.index().documents]
    # A link that stays inside the folder is an ordinary document.
    os.symlink(project / "docs" / "billing.md", project / "docs" / "alias.md")
    assert docs.content("docs/alias.md").content.startswith("# Billing")


def test_other_escapes_and_not_found(project: Path) -> None:
    docs = reader(project)
    for bad, message in [
        ("..\\..\\etc\\passwd.md", "path traversal"),
        ("docs/./../README.md", "path traversal"),
        ("~/notes.md", "absolute path"),
        ("C:/Windows/win.ini", "absolute path"),
        ("docs/a\0.md", "NUL byte"),
        ("", "empty path"),
        ("NOTES.md", "not inside a docs folder"),  # README.md is read: a root document
        ("docs/.hidden/x.md", "hidden files"),
    ]:
        with pytest.raises(InputError, match=message):
            docs.content(bad)
    with pytest.raises(InputError, match=r"no such document: 'docs/biling\.md'") as err:
        docs.content("docs/biling.md")
    assert "did you mean docs/billing.md" in str(err.value)
    assert docs.content("./docs//billing.md").path == "docs/billing.md"
    assert clean_relative("docs\\guide\\install.rst") == "docs/guide/install.rst"


def test_root_documents_are_listed_and_read_never_hidden_or_outside(project: Path, tmp_path: Path) -> None:
    write_files(project, {"CHANGES.rst": "Changes\n", "CONTRIBUTING": "Send patches.\n", "CHANGELOG.md": "# Log\n",
                          "README.exe": "MZ", "NOTES.md": "not a root document\n", ".README.md": "hidden\n"})
    (tmp_path / "outside.md").write_text("OUTSIDE\n")
    (project / "README.txt").symlink_to(tmp_path / "outside.md")  # a link out is not listed or read
    os.mkfifo(project / "CHANGELOG.txt")  # nor is a FIFO
    docs = reader(project)
    listed = [d.path for d in docs.index().documents if "/" not in d.path]
    assert listed == ["CHANGELOG.md", "CHANGES.rst", "CONTRIBUTING", "README.md"]
    assert docs.content("README.md").content.startswith("# Shop")
    assert docs.content("./CONTRIBUTING").content == "Send patches.\n"
    for bad, message in [("README.txt", "outside"), ("CHANGELOG.txt", "FIFO"), (".README.md", "not inside a docs folder"),
                         ("NOTES.md", "not inside a docs folder"), ("README.exe", "not inside a docs folder")]:
        with pytest.raises(InputError, match=message):
            docs.content(bad)


def test_docs_tools_over_mcp_work_without_an_index(project: Path) -> None:
    """The docs reader needs no lake; its errors reach the client as tool errors with hints."""
    server = build_server(load_settings(project))

    async def main() -> None:
        async with Client(server) as client:
            index = await call_ok(client, "docs_index")
            assert index["documents"][1]["path"] == "docs/billing.md"
            assert set(index["documents"][0]) == {"path", "name", "sizeBytes", "modifiedAt"}
            content = await call_ok(client, "docs_content", {"path": "docs/billing.md"})
            assert content["totalChunks"] == 1 and content["content"].startswith("# Billing")
            for bad in ["../../../etc/passwd", "/etc/passwd", "docs/../../x", "docs/conf.py"]:
                text = await call_error(client, "docs_content", {"path": bad})
                assert "not allowed" in text and "hint:" in text, text
            assert "greater than or equal to 1" in await call_error(
                client, "docs_content", {"path": "docs/billing.md", "chunk": 0})
            not_indexed = await call_error(client, "search_code", {"query": "invoice"})
            assert "not indexed yet" in not_indexed and "ctx run index" in not_indexed

    anyio.run(main)


def test_dot_source_lists_the_top_level_files_alone(project: Path, cli: object) -> None:
    write_files(project, {"CHANGES.rst": "Changes\n"})
    docs = reader(project)
    assert [d.path for d in docs.index(source=".").documents] == ["CHANGES.rst", "README.md"]
    assert all("/" in d.path for d in docs.index(source="docs").documents)
    listed = cli("docs", "--source", ".", cwd=project)  # type: ignore[operator]
    assert listed.exit_code == 0, listed.stderr
    assert listed.stdout.split("\n")[0].startswith("CHANGES.rst\t") and "docs/" not in listed.stdout
