"""Chunking with real tree-sitter grammars: symbols per language, coverage, splits, merges, docs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from ctxlake.schemas.config import IndexSettings
from ctxlake.tasks.chunk import (
    CHUNKERS,
    DEFAULT_OPTIONS,
    Chunk,
    ChunkOptions,
    ChunkResult,
    chunk_text,
    language_for,
)

# Small limits so a few lines of sample show class splits; min 1 keeps every symbol separate.
SPLIT = ChunkOptions(chunk_lines=20, chunk_overlap=2, max_chunk_lines=6, min_chunk_lines=1)

Row = tuple[str, str | None, int, int]


def check(text: str, result: ChunkResult) -> list[Chunk]:
    """The invariants every chunking keeps: exact texts, ordered, every line in some chunk."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    lines = [line.removesuffix("\r") for line in lines]
    covered = [False] * len(lines)
    previous_start = 0
    for chunk in result.chunks:
        assert 1 <= chunk.start_line <= chunk.end_line <= len(lines), chunk[:4]
        assert chunk.start_line >= previous_start, "chunks come in file order"
        assert chunk.text == "\n".join(lines[chunk.start_line - 1 : chunk.end_line])
        assert chunk.kind == chunk.kind.lower()
        previous_start = chunk.start_line
        for row in range(chunk.start_line - 1, chunk.end_line):
            covered[row] = True
    if text.strip():
        assert all(covered), [i + 1 for i, seen in enumerate(covered) if not seen]
    return result.chunks


def rows(text: str, lang: str | None, opts: ChunkOptions = DEFAULT_OPTIONS) -> list[Row]:
    result = chunk_text(text, lang, opts)
    assert result.warning is None, result.warning
    return [(c.kind, c.symbol, c.start_line, c.end_line) for c in check(text, result)]


SAMPLES: dict[str, tuple[str, list[Row]]] = {
    "python": (
        '''"""Module doc."""
import os

CONST = 1


# Decorated and documented.
@decorator
@other(arg=1)
def top(a, b):
    """Doc."""
    return a + b


class Outer(Base):
    """Outer doc."""

    field = 1

    def method_one(self):
        x = 1
        return x

    class Inner:
        def deep(self):
            pass
            return 3

        def deep2(self):
            return 4


if __name__ == "__main__":
    top(1, 2)
''',
        [
            ("module", None, 1, 6),
            ("function", "top", 7, 12),
            ("class", "Outer", 13, 19),
            ("method", "Outer.method_one", 20, 23),
            ("class", "Outer.Inner", 24, 24),
            ("method", "Outer.Inner.deep", 25, 28),
            ("method", "Outer.Inner.deep2", 29, 32),
            ("module", None, 33, 34),
        ],
    ),
    "javascript": (
        """import x from "x";

/** Adds. */
export function add(a, b) {
  return a + b;
}

export default class Widget extends Base {
  constructor() {
    super();
  }
  render() {
    return 1;
  }
}

const double = (n) => {
  return n * 2;
};

Widget.prototype.extra = function () {
  return 2;
};

module.exports = { add };
""",
        [
            ("module", None, 1, 2),
            ("function", "add", 3, 7),
            ("class", "Widget", 8, 8),
            ("method", "Widget.constructor", 9, 11),
            ("method", "Widget.render", 12, 16),
            ("function", "double", 17, 20),
            ("function", "Widget.extra", 21, 24),
            ("module", None, 25, 25),
        ],
    ),
    "typescript": (
        """import { x } from "x";

export interface Shape {
  area(): number;
}

enum Color { Red, Green }

namespace Geo {
  export function dist(a: number): number {
    return a;
  }
}

@Component({})
export class Circle implements Shape {
  r = 1;
  area(): number {
    return 3.14 * this.r;
  }
}
""",
        [
            ("module", None, 1, 2),
            ("interface", "Shape", 3, 6),
            ("enum", "Color", 7, 8),
            ("function", "Geo.dist", 9, 14),
            ("class", "Circle", 15, 17),
            ("method", "Circle.area", 18, 21),
        ],
    ),
    "tsx": (
        """import React from "react";

type Props = { name: string };

export function Hello({ name }: Props) {
  return <div>Hello {name}</div>;
}

export const App = () => {
  return <Hello name="x" />;
};
""",
        [
            ("module", None, 1, 2),
            ("type", "Props", 3, 4),
            ("function", "Hello", 5, 8),
            ("function", "App", 9, 11),
        ],
    ),
    "go": (
        """package main

import "fmt"

// Point is a point.
type Point struct {
	X, Y int
}

type Shape interface {
	Area() float64
}

// Norm returns the norm.
func (p *Point) Norm() int {
	return p.X*p.X + p.Y*p.Y
}

func (s Stack[T]) Push(v T) {
}

func main() {
	fmt.Println("hi")
}
""",
        [
            ("module", None, 1, 4),
            ("struct", "Point", 5, 9),
            ("interface", "Shape", 10, 13),
            ("method", "Point.Norm", 14, 18),
            ("method", "Stack.Push", 19, 21),
            ("function", "main", 22, 24),
        ],
    ),
    "rust": (
        """use std::fmt;

/// A point.
#[derive(Debug)]
pub struct Point {
    x: i32,
}

impl Point {
    pub fn new(x: i32) -> Self {
        Point { x }
    }

    pub fn twice(&self) -> i32 {
        self.x * 2
    }
}

pub trait Shape {
    fn area(&self) -> f64;
}

mod tests {
    fn helper() {}
}
""",
        [
            ("module", None, 1, 2),
            ("struct", "Point", 3, 8),
            ("impl", "Point", 9, 9),
            ("method", "Point.new", 10, 13),
            ("method", "Point.twice", 14, 18),
            ("trait", "Shape", 19, 22),
            ("function", "tests.helper", 23, 25),
        ],
    ),
    "java": (
        """package demo;

import java.util.List;

/** Doc. */
@Deprecated
public class Greeter {
    private final String name;

    public Greeter(String name) {
        this.name = name;
    }

    @Override
    public String toString() {
        return name;
    }

    interface Inner { void run(); }
}
""",
        [
            ("module", None, 1, 4),
            ("class", "Greeter", 5, 9),
            ("method", "Greeter.Greeter", 10, 13),
            ("method", "Greeter.toString", 14, 18),
            ("interface", "Greeter.Inner", 19, 20),
        ],
    ),
    "c": (
        """#include <stdio.h>

/* A point. */
struct point {
    int x;
    int y;
};

typedef struct { int a; } pair_t;

#ifndef NO_TWICE
static int *twice(int *x) {
    return x;
}
#endif
""",
        [
            ("module", None, 1, 2),
            ("struct", "point", 3, 8),
            ("struct", "pair_t", 9, 10),
            ("module", None, 11, 11),
            ("function", "twice", 12, 15),
        ],
    ),
    "cpp": (
        """#include <vector>

namespace geo {

class Shape {
public:
    virtual double area() const = 0;
    void draw() {
        return;
    }
};

template <typename T>
T max_of(T a, T b) {
    return a > b ? a : b;
}

}  // namespace geo

double geo::Shape::perimeter() const {
    return 0;
}
""",
        [
            ("module", None, 1, 2),
            ("class", "geo.Shape", 3, 7),
            ("method", "geo.Shape.draw", 8, 12),
            ("function", "geo.max_of", 13, 18),
            # the blank line would push max_of past max_chunk_lines, so it leads the next chunk
            ("function", "geo.Shape.perimeter", 19, 22),
        ],
    ),
    "csharp": (
        """using System;

namespace Demo.App
{
    /// <summary>Doc.</summary>
    [Serializable]
    public class Greeter
    {
        private string name;
        public string Greet()
        {
            return "hi " + name;
        }
    }

    public enum Color { Red, Green }
}
""",
        [
            ("module", None, 1, 2),
            ("class", "Demo.App.Greeter", 3, 9),
            ("method", "Demo.App.Greeter.Greet", 10, 15),
            ("enum", "Demo.App.Color", 16, 17),
        ],
    ),
    "ruby": (
        """require "json"

# Greets people.
module Demo
  class Greeter < Base
    def initialize(name)
      @name = name
    end

    def self.create
      new("x")
    end
  end
end

def helper(x)
  x * 2
end
""",
        [
            ("module", None, 1, 2),
            ("class", "Demo.Greeter", 3, 5),
            ("method", "Demo.Greeter.initialize", 6, 9),
            ("method", "Demo.Greeter.create", 10, 15),
            ("function", "helper", 16, 18),
        ],
    ),
    "php": (
        """<?php
namespace App\\Models;

/** Doc. */
#[Attr]
class User extends Model
{
    public function name(): string
    {
        return $this->name;
    }
}

trait Greets { public function greet() { return 1; } }

function helper($x) {
    return $x;
}
""",
        [
            ("module", None, 1, 3),
            ("class", "User", 4, 7),
            ("method", "User.name", 8, 13),
            ("trait", "Greets", 14, 15),
            ("function", "helper", 16, 18),
        ],
    ),
    "kotlin": (
        """package demo

/** Doc for Greeter. */
@Suppress("x")
class Greeter(val name: String) {
    fun greet(): String {
        return "hi $name"
    }
    companion object {
        fun create(): Greeter = Greeter("x")
    }
}

interface Shape {
    fun area(): Double
}

fun topLevel(x: Int): Int {
    return x + 1
}
""",
        [
            ("module", None, 1, 2),
            ("class", "Greeter", 3, 5),
            ("method", "Greeter.greet", 6, 8),
            ("object", "Greeter.Companion", 9, 13),
            ("interface", "Shape", 14, 17),
            ("function", "topLevel", 18, 20),
        ],
    ),
    "swift": (
        """import Foundation

/// A point.
struct Point {
    var x: Int
    func norm() -> Int {
        return x * x
    }
}

protocol Drawable {
    func draw()
}

extension Point {
    func twice() -> Int { return 2 * x }
}
""",
        [
            ("module", None, 1, 2),
            ("struct", "Point", 3, 5),
            ("method", "Point.norm", 6, 10),
            ("interface", "Drawable", 11, 14),
            ("extension", "Point", 15, 17),
        ],
    ),
    "scala": (
        """package demo

/** Doc. */
class Greeter(name: String) {
  def greet(): String = {
    s"hi $name"
  }
  def bye(): String = {
    s"bye $name"
  }
}

trait Shape {
  def area: Double
}

def topLevel(x: Int): Int =
  x + 1
""",
        [
            ("module", None, 1, 2),
            ("class", "Greeter", 3, 4),
            ("method", "Greeter.greet", 5, 7),
            ("method", "Greeter.bye", 8, 12),
            ("trait", "Shape", 13, 16),
            ("function", "topLevel", 17, 18),
        ],
    ),
    "lua": (
        """local M = {}

-- Adds numbers.
function M.add(a, b)
  return a + b
end

function M:method()
  return self
end

local function helper(x)
  return x
end

return M
""",
        [
            ("module", None, 1, 2),
            ("function", "M.add", 3, 7),
            ("function", "M.method", 8, 11),
            ("function", "helper", 12, 15),
            ("module", None, 16, 16),
        ],
    ),
    "bash": (
        """#!/bin/bash
set -e

# Say hello.
greet() {
  echo "hi $1"
}

function cleanup {
  rm -rf /tmp/x
}

greet world
""",
        [
            ("module", None, 1, 3),
            ("function", "greet", 4, 8),
            ("function", "cleanup", 9, 12),
            ("module", None, 13, 13),
        ],
    ),
}


@pytest.mark.parametrize("lang", sorted(SAMPLES))
def test_symbols_per_language(lang: str) -> None:
    source, expected = SAMPLES[lang]
    assert rows(source, lang, SPLIT) == expected


@pytest.mark.parametrize("lang", sorted(SAMPLES))
def test_every_line_covered_with_default_options_and_crlf(lang: str) -> None:
    source = SAMPLES[lang][0]
    lf = rows(source, lang)
    crlf_text = source.replace("\n", "\r\n")
    crlf = chunk_text(crlf_text, lang)
    check(crlf_text, crlf)
    assert [(c.kind, c.symbol, c.start_line, c.end_line) for c in crlf.chunks] == lf
    assert not any("\r" in c.text for c in crlf.chunks)


def test_registry_covers_every_language_docs_and_text() -> None:
    assert set(SAMPLES) | {"markdown", "rst", "text"} <= set(CHUNKERS)


def test_small_class_stays_one_chunk_that_names_its_methods() -> None:
    source = """import os


class Small:
    def a(self):
        return 1

    def b(self):
        return 2


def one(): return 1
def two(): return 2
def three(): return 3
X = 1
"""
    assert rows(source, "python") == [
        ("module", None, 1, 3),
        ("class", "Small, Small.a, Small.b", 4, 11),
        ("module", "one, two, three", 12, 15),
    ]
    only_functions = "def one(): return 1\ndef two(): return 2\n\n\ndef three(): return 3\n"
    assert rows(only_functions, "python") == [("function", "one, two, three", 1, 5)]


def test_oversized_class_splits_into_members_with_header_chunk() -> None:
    methods = "".join(
        f"\n    def method_{i}(self):\n" + "".join(f"        x = {j}\n" for j in range(8))
        for i in range(20)
    )
    header = '@dataclass\nclass Big(Base):\n    """Doc."""\n\n    a = 1\n    def tiny(self): pass\n'
    source = header + methods
    chunks = check(source, chunk_text(source, "python"))
    assert (chunks[0].kind, chunks[0].symbol, chunks[0].start_line) == ("class", "Big", 1)
    assert "a = 1" in chunks[0].text  # the header keeps decorators, docstring and fields
    assert [c.symbol for c in chunks[1:]] == ["Big.tiny"] + [f"Big.method_{i}" for i in range(20)]
    assert {c.kind for c in chunks[1:]} == {"method"}


def test_oversized_function_becomes_overlapping_windows() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(98))
    source = f"def huge():\n{body}    return 0\n"
    opts = ChunkOptions(chunk_lines=30, chunk_overlap=5, max_chunk_lines=50, min_chunk_lines=4)
    chunks = check(source, chunk_text(source, "python", opts))
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 30), (26, 55), (51, 80), (76, 100)]
    assert {(c.kind, c.symbol) for c in chunks} == {("function", "huge")}


def test_go_receivers_and_rust_impls_qualify_methods() -> None:
    go = (
        "package p\n\nfunc (b *Buf[K, V]) Len() int {\n\treturn 0\n}\n\n"
        "func (Buf) Cap() int {\n\treturn 1\n}\n"
    )
    assert [(k, s) for k, s, _, _ in rows(go, "go")] == [
        ("module", None), ("method", "Buf.Len"), ("method", "Buf.Cap"),
    ]
    rust = SAMPLES["rust"][0]
    split = rows(rust, "rust", SPLIT)
    assert ("method", "Point.new", 10, 13) in split
    generic = (
        "impl<T: Clone> Wrapper<T> {\n"
        "    fn get(&self) -> T {\n        self.0.clone()\n    }\n}\n"
    )
    assert rows(generic, "rust") == [("impl", "Wrapper", 1, 5)]
    tight = ChunkOptions(max_chunk_lines=4, min_chunk_lines=1)
    assert rows(generic, "rust", tight) == [
        ("impl", "Wrapper", 1, 1),
        ("method", "Wrapper.get", 2, 5),
    ]


def test_decorators_annotations_and_doc_comments_belong_to_the_symbol() -> None:
    python = SAMPLES["python"][0]
    top = next(c for c in chunk_text(python, "python").chunks if c.symbol == "top")
    assert top.text.startswith("# Decorated and documented.\n@decorator\n@other(arg=1)\ndef top")
    java = """class A {
    int f;

    /** Doc. */
    @Override
    @Deprecated
    public String toString() {
        return "";
    }
}
"""
    chunks = chunk_text(java, "java", SPLIT).chunks
    method = next(c for c in chunks if c.symbol == "A.toString")
    assert method.start_line == 4 and method.text.lstrip().startswith("/** Doc. */")
    # A comment separated by a blank line is not the symbol's doc.
    detached = "# about the module\n\ndef f():\n    pass\n    return 1\n    # end\n"
    assert rows(detached, "python") == [("module", None, 1, 2), ("function", "f", 3, 6)]


def test_markdown_sections_follow_heading_paths() -> None:
    source = """---
title: x
---
Intro text.

# Project

Some words.

## Install

### From source

Run make.

```sh
# not a heading
make
```

Setext Title
============

Body.

Sub
---

More body, long enough
to stand alone
as a section.
"""
    assert rows(source, "markdown") == [
        ("section", None, 1, 5),
        ("section", "Project", 6, 9),
        ("section", "Project > Install > From source", 10, 20),  # the empty parent folds in
        ("section", "Setext Title", 21, 25),
        ("section", "Setext Title > Sub", 26, 31),
    ]


def test_long_markdown_section_is_split_into_windows() -> None:
    source = "# Title\n" + "".join(f"line {i}\n" for i in range(199))
    opts = ChunkOptions(chunk_lines=60, chunk_overlap=10, max_chunk_lines=150)
    found = rows(source, "markdown", opts)
    assert [(s, e) for _, _, s, e in found] == [(1, 60), (51, 110), (101, 160), (151, 200)]
    assert {(k, s) for k, s, _, _ in found} == {("section", "Title")}


def test_rst_titles_with_underlines_and_overlines() -> None:
    source = """Preamble line.

=======
 Title
=======

Intro.

Install
-------

Run it.

From source
~~~~~~~~~~~

Build.

Usage
-----

::

    literal
    -------

Done.
"""
    assert rows(source, "rst") == [
        ("section", None, 1, 2),
        ("section", "Title", 3, 8),
        ("section", "Title > Install", 9, 13),
        ("section", "Title > Install > From source", 14, 18),
        ("section", "Title > Usage", 19, 27),
    ]


def test_parse_failure_falls_back_to_line_windows_with_warning() -> None:
    garbage = "".join(chr(c) for c in range(256)) * 40
    result = chunk_text(garbage, "python")
    assert result.warning is not None and "python parse failed" in result.warning
    assert "fell back to line windows" in result.warning
    assert {c.kind for c in check(garbage, result)} == {"lines"}
    broken = "".join("}}} ) ] {{ class ( def\n" for _ in range(50))
    fallback = chunk_text(broken, "python")
    assert fallback.warning is not None and {c.kind for c in check(broken, fallback)} == {"lines"}


def test_one_syntax_error_keeps_the_other_symbols() -> None:
    source = (
        "def good():\n    return 1\n\n\ndef bad(:\n    return 2\n\n\n"
        "def also_good():\n    return 3\n"
    )
    result = chunk_text(source, "python")
    assert result.warning is None
    assert {c.symbol for c in check(source, result)} >= {"good", "also_good"}


@pytest.mark.parametrize("text", ["", "\n", "   \n\t\n", "\r\n"])
def test_blank_text_has_no_chunks(text: str) -> None:
    for lang in ("python", "markdown", "text", None):
        assert chunk_text(text, lang) == ChunkResult([], None)


def test_line_windows_for_text_and_unknown_languages() -> None:
    source = "".join(f"row {i}\n" for i in range(130))
    for lang in ("text", "json", None, "no-such-language"):
        found = rows(source, lang)
        assert [(s, e) for _, _, s, e in found] == [(1, 60), (51, 110), (101, 130)]
        assert {(k, s) for k, s, _, _ in found} == {("lines", None)}


def test_no_trailing_newline_long_lines_and_odd_options() -> None:
    source = "def f():\n    return 1\n\nx = 2"
    assert rows(source, "python") == [("module", "f", 1, 4)]
    long_line = "x = '" + "a" * 1_000_000 + "'\n"
    assert rows(long_line, "python") == [("module", None, 1, 1)]
    odd = ChunkOptions(chunk_lines=0, chunk_overlap=99, max_chunk_lines=0, min_chunk_lines=0)
    check(SAMPLES["go"][0], chunk_text(SAMPLES["go"][0], "go", odd))
    check("a\nb\nc\n", chunk_text("a\nb\nc\n", "text", odd))


def test_twenty_thousand_line_file_is_covered() -> None:
    # Speed is measured in the benchmark (tests/bench/bench_index.py), not asserted here.
    block = "def f{i}(x):\n    y = x + {i}\n    z = y * 2\n    return z\n\n\n"
    source = "".join(block.format(i=i) for i in range(3400))
    assert source.count("\n") > 20_000
    chunks = check(source, chunk_text(source, "python"))
    assert len(chunks) == 3400 and chunks[-1].symbol == "f3399"


def test_parsers_are_safe_across_threads() -> None:
    jobs = [(SAMPLES[lang][0], lang) for lang in sorted(SAMPLES)] * 4
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda job: chunk_text(job[0], job[1], SPLIT), jobs))
    for (source, lang), result in zip(jobs, results, strict=True):
        found = [(c.kind, c.symbol, c.start_line, c.end_line) for c in result.chunks]
        assert found == SAMPLES[lang][1]
        check(source, result)


def test_options_from_settings() -> None:
    index = IndexSettings(chunk_lines=40, chunk_overlap=5, max_chunk_lines=100, min_chunk_lines=2)
    assert ChunkOptions.from_settings(index) == ChunkOptions(40, 5, 100, 2)
    assert ChunkOptions.from_settings(IndexSettings()) == ChunkOptions()


@pytest.mark.parametrize(
    ("path", "lang"),
    [
        ("src/app.py", "python"),
        ("types.pyi", "python"),
        ("web/App.JSX", "javascript"),
        ("lib/mod.mjs", "javascript"),
        ("a/b.ts", "typescript"),
        ("a/b.tsx", "tsx"),
        ("main.go", "go"),
        ("lib.rs", "rust"),
        ("A.java", "java"),
        ("x.c", "c"),
        ("x.h", "cpp"),
        ("x.hpp", "cpp"),
        ("Program.cs", "csharp"),
        ("Rakefile", "ruby"),
        ("app.rb", "ruby"),
        ("index.php", "php"),
        ("build.gradle.kts", "kotlin"),
        ("View.swift", "swift"),
        ("Main.scala", "scala"),
        ("init.lua", "lua"),
        ("scripts/run.sh", "bash"),
        ("/srv/u/.bashrc", "bash"),
        ("README.md", "markdown"),
        ("docs/index.rst", "rst"),
        ("notes.txt", "text"),
        ("package.json", "json"),
        ("ci.yml", "yaml"),
        ("pyproject.toml", "toml"),
        ("page.html", "html"),
        ("style.css", "css"),
        ("schema.sql", "sql"),
        ("Makefile", "make"),
        ("Dockerfile", "dockerfile"),
        ("Dockerfile.dev", "dockerfile"),
        ("C:\\src\\Main.kt", "kotlin"),
        ("LICENSE", "text"),
        ("archive.xyz", None),
        ("noextension", None),
        (".hidden", None),
    ],
)
def test_language_for(path: str, lang: str | None) -> None:
    assert language_for(path) == lang
