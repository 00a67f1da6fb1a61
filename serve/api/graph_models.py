"""Wire formats of the code graph: what `ctx def/refs/related/outline --json` print and the MCP
graph tools return. Apart from serve/api/graph.py so that the MCP server declares its tools
without importing pyarrow."""

from __future__ import annotations

from pydantic import BaseModel, Field

from ctxlake.schemas.names import PROJECT_SOURCE


class Definition(BaseModel):
    path: str = Field(description="file, relative to its source root")
    qualname: str = Field(description="qualified name, e.g. Class.method")
    kind: str = Field(description="function, method, class, struct, ...")
    start_line: int = Field(description="first line, 1-based")
    end_line: int = Field(description="last line, inclusive")
    signature: str = Field(description="the definition's first line")
    doc: str | None = Field(default=None, description="first line of its docstring or doc comment")
    parent: str | None = Field(default=None, description="qualname of the enclosing definition")
    source: str = Field(default=PROJECT_SOURCE, description="the source the file belongs to")


class DefinitionAnswer(BaseModel):
    symbol: str = Field(description="the name asked for")
    definitions: list[Definition] = Field(description="best first; the first is the answer")
    ambiguous: bool = Field(description="true when several definitions match and none clearly wins")
    confidence: float = Field(description="0-1: how sure the first definition is the one meant")
    reason: str = Field(description="why the first one ranks first")


class Reference(BaseModel):
    source: str = Field(default=PROJECT_SOURCE, description="the source the file belongs to")
    path: str = Field(description="file, relative to its source root")
    line: int = Field(description="line, 1-based")
    kind: str = Field(description="call, attribute, name or import")
    enclosing: str | None = Field(default=None, description="qualname of the definition it sits in")
    snippet: str = Field(default="", description="the line's text, trimmed")
    resolved: bool = Field(description="true when the file defines or imports the symbol's file")


class ReferencePage(BaseModel):
    symbol: str = Field(description="the name asked for")
    total: int = Field(description="references found in all")
    offset: int = Field(description="index of the first reference on this page")
    references: list[Reference] = Field(description="this page, resolved ones first, then by path and line")
    next_offset: int | None = Field(default=None, description="offset of the next page, or null")
    definitions: list[str] = Field(description="path:line of the definitions the name has")


class RelatedFile(BaseModel):
    path: str = Field(description="the related file")
    relation: str = Field(description="imports (this file imports it), imported_by, or cochange")
    weight: float = Field(default=1.0, description=(
        "1.0 for import links; for co-change 1 - 0.5 ** n, n the commits that changed both files, "
        "newer ones weighing more (a year-old commit counts half)"))
    commits: int | None = Field(default=None, description="co-change: the commits that changed both files")


class RelatedAnswer(BaseModel):
    source: str = Field(default=PROJECT_SOURCE, description="the source the file belongs to")
    path: str = Field(description="the file asked about")
    related: list[RelatedFile] = Field(description="imports first, then importers, then co-changed files")
    unresolved_imports: list[str] = Field(description="modules it imports that map to no indexed file")


class OutlineItem(BaseModel):
    qualname: str = Field(description="qualified name")
    kind: str = Field(description="function, method, class, ...")
    start_line: int = Field(description="first line, 1-based")
    end_line: int = Field(description="last line")
    signature: str = Field(description="the first line of the definition")
    doc: str | None = Field(default=None, description="first docstring line")
    depth: int = Field(description="nesting depth: 0 for top level, 1 for a method ...")


class Outline(BaseModel):
    source: str = Field(default=PROJECT_SOURCE, description="the source the file belongs to")
    path: str = Field(description="the file")
    items: list[OutlineItem] = Field(description="definitions in file order")
