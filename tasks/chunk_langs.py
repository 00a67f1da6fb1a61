"""Chunk stage, language tables: which tree-sitter nodes are symbols, containers and names."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import NamedTuple

from tree_sitter import Node

# (kind, unqualified name) for a definition, or None when the node is not one after all.
Resolver = Callable[[Node], "tuple[str, str | None] | None"]


class LangSpec(NamedTuple):
    """How one grammar spells definitions; every set holds tree-sitter node types."""

    defs: Mapping[str, str]  # node type -> kind, name from the `name` field
    resolvers: Mapping[str, Resolver]  # node types whose kind or name needs a closer look
    wrappers: frozenset[str]  # export/decorator/template nodes: the definition is inside
    containers: frozenset[str]  # definitions with members (split into them when oversized)
    namespaces: frozenset[str]  # containers always opened: their members are the chunks
    method_parents: frozenset[str]  # containers whose functions are methods
    bodies: frozenset[str]  # member lists found without a `body` field, or nested in one
    flatten: frozenset[str]  # blocks whose children count as siblings (#ifdef include guards)
    comment_prefixes: tuple[str, ...]  # lines directly above a symbol that belong to it


class Found(NamedTuple):
    kind: str
    name: str | None
    node: Node  # the definition itself, inside any wrapper


# Children that name a definition in grammars without a `name` field (Kotlin).
_NAME_TYPES = frozenset({"type_identifier", "simple_identifier", "identifier", "constant", "name"})
_SEPARATORS = re.compile(r"::|\\|:|\s+")
_IDENT = re.compile(r"[A-Za-z_]\w*")


def text(node: Node) -> str:
    raw = node.text
    return raw.decode("utf-8", "replace") if raw is not None else ""


def clean(name: str) -> str | None:
    """Scope separators of every language (::, \\, Lua's :) become dots; quotes go."""
    name = _SEPARATORS.sub(lambda m: "" if m.group().isspace() else ".", name.strip("\"'` \t"))
    return name.strip(".") or None


def name_of(node: Node) -> str | None:
    named = node.child_by_field_name("name")
    if named is None:
        named = next((c for c in node.named_children if c.type in _NAME_TYPES), None)
    return clean(text(named)) if named is not None else None


def describe(node: Node, spec: LangSpec) -> Found | None:
    """The definition `node` is or wraps, or None for code that only glues symbols together."""
    kind = node.type
    if kind in spec.wrappers:
        for child in node.named_children:
            found = describe(child, spec)
            if found is not None:
                return found
        return None
    resolver = spec.resolvers.get(kind)
    if resolver is not None:
        resolved = resolver(node)
        return Found(resolved[0], resolved[1], node) if resolved is not None else None
    mapped = spec.defs.get(kind)
    return Found(mapped, name_of(node), node) if mapped is not None else None


def flat(nodes: list[Node], spec: LangSpec) -> list[Node]:
    """Sibling nodes with preprocessor blocks opened: a header's symbols sit in its guard."""
    if not spec.flatten or not any(n.type in spec.flatten for n in nodes):
        return nodes
    out: list[Node] = []
    for node in nodes:
        if node.type in spec.flatten:
            out.extend(flat(node.named_children, spec))
        else:
            out.append(node)
    return out


def members(node: Node, spec: LangSpec) -> list[Node]:
    """A container's member nodes, nested member lists (Java enum bodies) flattened."""
    body = node.child_by_field_name("body")
    if body is None:
        body = next((c for c in node.named_children if c.type in spec.bodies), None)
    if body is None:
        return []
    out: list[Node] = []
    for child in body.named_children:
        if child.type in spec.bodies:
            out.extend(child.named_children)
        else:
            out.append(child)
    return out


def _with_body(kind: str) -> Resolver:
    # `mod foo;`, `namespace Foo;` declare a scope for the rest of the file: plain glue here.
    def resolve(node: Node) -> tuple[str, str | None] | None:
        return (kind, name_of(node)) if node.child_by_field_name("body") is not None else None

    return resolve


_JS_FUNCTIONS = frozenset(
    {"arrow_function", "function_expression", "function", "generator_function"}
)


def _js_variable(node: Node) -> tuple[str, str | None] | None:
    """`const f = () => ...` is how much modern JS spells a function."""
    declarator = next((c for c in node.named_children if c.type == "variable_declarator"), None)
    if declarator is None:
        return None
    value = declarator.child_by_field_name("value")
    if value is None:
        return None
    if value.type in _JS_FUNCTIONS:
        return ("function", name_of(declarator))
    if value.type in ("class", "class_expression"):
        return ("class", name_of(declarator))
    return None


def _js_assignment(node: Node) -> tuple[str, str | None] | None:
    """`Foo.prototype.bar = function () {...}`, the pre-class way to write a method."""
    value = node.child_by_field_name("right")
    target = node.child_by_field_name("left")
    if value is None or target is None or value.type not in _JS_FUNCTIONS:
        return None
    return ("function", clean(text(target).replace(".prototype.", ".")))


def _go_method(node: Node) -> tuple[str, str | None]:
    """The receiver's type qualifies the name: `func (p *Point) Norm()` -> Point.Norm."""
    name = name_of(node)
    receiver = node.child_by_field_name("receiver")
    inner = re.sub(r"\[.*\]", "", text(receiver).strip()[1:-1]) if receiver is not None else ""
    words = inner.replace("*", " ").split()
    return ("method", f"{words[-1]}.{name}" if words and name else name)


def _go_type(node: Node) -> tuple[str, str | None] | None:
    specs = [c for c in node.named_children if c.type in ("type_spec", "type_alias")]
    if not specs:
        return None
    kind = "type"
    if len(specs) == 1:
        shape = specs[0].child_by_field_name("type")
        kind = {"struct_type": "struct", "interface_type": "interface"}.get(
            shape.type if shape is not None else "", "type"
        )
    names = [n for n in (name_of(s) for s in specs) if n]
    return (kind, ", ".join(names) or None)


def _rust_impl(node: Node) -> tuple[str, str | None]:
    target = node.child_by_field_name("type")
    return ("impl", clean(re.sub(r"<.*", "", text(target))) if target is not None else None)


def _c_function(node: Node) -> tuple[str, str | None]:
    """The name hides under pointer/reference declarators: `static int *f(void)`."""
    declarator = node.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        inner = declarator.child_by_field_name("declarator")
        if inner is None:
            inner = next((c for c in declarator.named_children if "declarator" in c.type), None)
        declarator = inner
    if declarator is None:
        return ("function", None)
    target = declarator.child_by_field_name("declarator")
    return ("function", clean(text(target)) if target is not None else None)


_C_SHAPES = {"struct_specifier": "struct", "union_specifier": "struct", "enum_specifier": "enum"}


def _c_typedef(node: Node) -> tuple[str, str | None]:
    """`typedef struct {...} name_t;` is a struct named by its declarator."""
    shape = node.child_by_field_name("type")
    kind = "type"
    if shape is not None and shape.child_by_field_name("body") is not None:
        kind = _C_SHAPES.get(shape.type, kind)
    declarator = node.child_by_field_name("declarator")
    found = _IDENT.search(text(declarator)) if declarator is not None else None
    return (kind, found.group() if found else None)


def _kotlin_class(node: Node) -> tuple[str, str | None]:
    keywords = {c.type for c in node.children if not c.is_named}
    kind = "interface" if "interface" in keywords else "enum" if "enum" in keywords else "class"
    return (kind, name_of(node))


def _swift_class(node: Node) -> tuple[str, str | None]:
    keyword = node.child_by_field_name("declaration_kind")
    kind = text(keyword) if keyword is not None else "class"
    return ({"actor": "class"}.get(kind, kind), name_of(node))


def _companion(node: Node) -> tuple[str, str | None]:
    return ("object", name_of(node) or "Companion")


C_COMMENTS = ("//", "/*", "*")

_JS_DEFS = {
    "function_declaration": "function",
    "generator_function_declaration": "function",
    "class_declaration": "class",
    "method_definition": "method",
}
_JS = LangSpec(
    defs=_JS_DEFS,
    resolvers={
        "lexical_declaration": _js_variable,
        "variable_declaration": _js_variable,
        "assignment_expression": _js_assignment,
    },
    wrappers=frozenset({"export_statement", "expression_statement"}),
    containers=frozenset({"class_declaration"}),
    namespaces=frozenset(),
    method_parents=frozenset({"class_declaration"}),
    bodies=frozenset(),
    flatten=frozenset(),
    comment_prefixes=(*C_COMMENTS, "@"),
)
_TS = _JS._replace(
    defs={
        **_JS_DEFS,
        "abstract_class_declaration": "class",
        "interface_declaration": "interface",
        "enum_declaration": "enum",
        "type_alias_declaration": "type",
        "function_signature": "function",
        "abstract_method_signature": "method",
    },
    resolvers={
        **_JS.resolvers,
        "internal_module": _with_body("namespace"),
        "module": _with_body("namespace"),
    },
    # `namespace X {}` parses as an expression statement; `declare module` as an ambient one.
    wrappers=frozenset({"export_statement", "ambient_declaration", "expression_statement"}),
    containers=frozenset(
        {"class_declaration", "abstract_class_declaration", "interface_declaration",
         "internal_module", "module"}
    ),
    namespaces=frozenset({"internal_module", "module"}),
    method_parents=frozenset(
        {"class_declaration", "abstract_class_declaration", "interface_declaration"}
    ),
)
_C = LangSpec(
    defs=_C_SHAPES,
    resolvers={"function_definition": _c_function, "type_definition": _c_typedef},
    wrappers=frozenset(),
    containers=frozenset(),
    namespaces=frozenset(),
    method_parents=frozenset(),
    bodies=frozenset(),
    flatten=frozenset(
        {"preproc_if", "preproc_ifdef", "preproc_else", "preproc_elif", "preproc_elifdef",
         "linkage_specification", "declaration_list"}
    ),
    comment_prefixes=C_COMMENTS,
)
_CPP_CLASSES = frozenset({"class_specifier", "struct_specifier", "union_specifier"})
_CPP = _C._replace(
    defs={**_C.defs, "class_specifier": "class"},
    resolvers={**_C.resolvers, "namespace_definition": _with_body("namespace")},
    wrappers=frozenset({"template_declaration"}),
    containers=_CPP_CLASSES | {"namespace_definition"},
    namespaces=frozenset({"namespace_definition"}),
    method_parents=_CPP_CLASSES,
)

_JAVA_TYPES = frozenset(
    {"class_declaration", "interface_declaration", "enum_declaration", "record_declaration",
     "annotation_type_declaration"}
)
_CSHARP_TYPES = frozenset(
    {"class_declaration", "struct_declaration", "interface_declaration", "record_declaration",
     "record_struct_declaration"}
)
_KOTLIN_TYPES = frozenset({"class_declaration", "object_declaration", "companion_object"})
_SWIFT_TYPES = frozenset({"class_declaration", "protocol_declaration"})
_SCALA_TYPES = frozenset(
    {"class_definition", "object_definition", "trait_definition", "enum_definition"}
)
_RUBY_SCOPES = frozenset({"class", "module", "singleton_class"})
_PHP_TYPES = frozenset(
    {"class_declaration", "interface_declaration", "trait_declaration", "enum_declaration"}
)

LANGS: dict[str, LangSpec] = {
    "python": LangSpec(
        defs={"function_definition": "function", "class_definition": "class"},
        resolvers={},
        wrappers=frozenset({"decorated_definition"}),
        containers=frozenset({"class_definition"}),
        namespaces=frozenset(),
        method_parents=frozenset({"class_definition"}),
        bodies=frozenset(),
        flatten=frozenset(),
        comment_prefixes=("#",),
    ),
    "javascript": _JS,
    "typescript": _TS,
    "tsx": _TS,
    "go": LangSpec(
        defs={"function_declaration": "function"},
        resolvers={"method_declaration": _go_method, "type_declaration": _go_type},
        wrappers=frozenset(),
        containers=frozenset(),
        namespaces=frozenset(),
        method_parents=frozenset(),
        bodies=frozenset(),
        flatten=frozenset(),
        comment_prefixes=C_COMMENTS,
    ),
    "rust": LangSpec(
        defs={
            "function_item": "function",
            "function_signature_item": "function",
            "struct_item": "struct",
            "union_item": "struct",
            "enum_item": "enum",
            "trait_item": "trait",
            "type_item": "type",
            "macro_definition": "macro",
        },
        resolvers={"impl_item": _rust_impl, "mod_item": _with_body("module")},
        wrappers=frozenset(),
        containers=frozenset({"impl_item", "trait_item", "mod_item"}),
        namespaces=frozenset({"mod_item"}),
        method_parents=frozenset({"impl_item", "trait_item"}),
        bodies=frozenset(),
        flatten=frozenset(),
        comment_prefixes=(*C_COMMENTS, "#["),
    ),
    "java": LangSpec(
        defs={
            "class_declaration": "class",
            "record_declaration": "class",
            "interface_declaration": "interface",
            "annotation_type_declaration": "interface",
            "enum_declaration": "enum",
            "method_declaration": "method",
            "constructor_declaration": "method",
            "compact_constructor_declaration": "method",
        },
        resolvers={},
        wrappers=frozenset(),
        containers=_JAVA_TYPES,
        namespaces=frozenset(),
        method_parents=_JAVA_TYPES,
        bodies=frozenset({"enum_body_declarations"}),
        flatten=frozenset(),
        comment_prefixes=(*C_COMMENTS, "@"),
    ),
    "c": _C,
    "cpp": _CPP,
    "csharp": LangSpec(
        defs={
            "class_declaration": "class",
            "record_declaration": "class",
            "struct_declaration": "struct",
            "record_struct_declaration": "struct",
            "interface_declaration": "interface",
            "enum_declaration": "enum",
            "method_declaration": "method",
            "constructor_declaration": "method",
            "destructor_declaration": "method",
            "operator_declaration": "method",
            "property_declaration": "property",
        },
        resolvers={"namespace_declaration": _with_body("namespace")},
        wrappers=frozenset(),
        containers=_CSHARP_TYPES | {"namespace_declaration"},
        namespaces=frozenset({"namespace_declaration"}),
        method_parents=_CSHARP_TYPES,
        bodies=frozenset(),
        flatten=frozenset(),
        comment_prefixes=(*C_COMMENTS, "["),
    ),
    "ruby": LangSpec(
        defs={
            "class": "class",
            "module": "module",
            "singleton_class": "class",
            "method": "function",
            "singleton_method": "function",
        },
        resolvers={},
        wrappers=frozenset(),
        containers=_RUBY_SCOPES,
        # Ruby modules mostly namespace whole files; `class << self` only scopes methods.
        namespaces=frozenset({"module", "singleton_class"}),
        method_parents=_RUBY_SCOPES,
        bodies=frozenset(),
        flatten=frozenset(),
        comment_prefixes=("#",),
    ),
    "php": LangSpec(
        defs={
            "class_declaration": "class",
            "interface_declaration": "interface",
            "trait_declaration": "trait",
            "enum_declaration": "enum",
            "function_definition": "function",
            "method_declaration": "method",
        },
        resolvers={"namespace_definition": _with_body("namespace")},
        wrappers=frozenset(),
        containers=_PHP_TYPES | {"namespace_definition"},
        namespaces=frozenset({"namespace_definition"}),
        method_parents=_PHP_TYPES,
        bodies=frozenset(),
        flatten=frozenset(),
        comment_prefixes=(*C_COMMENTS, "#"),
    ),
    "kotlin": LangSpec(
        defs={
            "object_declaration": "object",
            "function_declaration": "function",
            "secondary_constructor": "method",
        },
        resolvers={"class_declaration": _kotlin_class, "companion_object": _companion},
        wrappers=frozenset(),
        containers=_KOTLIN_TYPES,
        namespaces=frozenset(),
        method_parents=_KOTLIN_TYPES,
        bodies=frozenset({"class_body", "enum_class_body"}),
        flatten=frozenset(),
        comment_prefixes=(*C_COMMENTS, "@"),
    ),
    "swift": LangSpec(
        defs={
            "protocol_declaration": "interface",
            "function_declaration": "function",
            "protocol_function_declaration": "method",
            "init_declaration": "method",
            "typealias_declaration": "type",
        },
        resolvers={"class_declaration": _swift_class},
        wrappers=frozenset(),
        containers=_SWIFT_TYPES,
        namespaces=frozenset(),
        method_parents=_SWIFT_TYPES,
        bodies=frozenset(),
        flatten=frozenset(),
        comment_prefixes=(*C_COMMENTS, "@"),
    ),
    "scala": LangSpec(
        defs={
            "class_definition": "class",
            "object_definition": "object",
            "trait_definition": "trait",
            "enum_definition": "enum",
            "function_definition": "function",
            "function_declaration": "function",
        },
        resolvers={},
        wrappers=frozenset(),
        containers=_SCALA_TYPES,
        namespaces=frozenset(),
        method_parents=_SCALA_TYPES,
        bodies=frozenset(),
        flatten=frozenset(),
        comment_prefixes=(*C_COMMENTS, "@"),
    ),
    "lua": LangSpec(
        defs={"function_declaration": "function"},
        resolvers={},
        wrappers=frozenset(),
        containers=frozenset(),
        namespaces=frozenset(),
        method_parents=frozenset(),
        bodies=frozenset(),
        flatten=frozenset(),
        comment_prefixes=("--",),
    ),
    "bash": LangSpec(
        defs={"function_definition": "function"},
        resolvers={},
        wrappers=frozenset(),
        containers=frozenset(),
        namespaces=frozenset(),
        method_parents=frozenset(),
        bodies=frozenset(),
        flatten=frozenset(),
        comment_prefixes=("#",),
    ),
}

# File extensions (lowercase, no dot) and well-known file names -> language tags. Tags without
# a grammar here (json, yaml, ...) still name the file's language; the line chunker takes them.
EXTENSIONS = {
    ext: lang
    for lang, exts in {
        "python": "py pyi pyw",
        "javascript": "js mjs cjs jsx",
        "typescript": "ts mts cts",
        "tsx": "tsx",
        "go": "go",
        "rust": "rs",
        "java": "java",
        "c": "c",
        # C++ headers outnumber C ones in mixed trees, and the C++ grammar reads C as well.
        "cpp": "h cc cpp cxx c++ hpp hh hxx h++ ipp inl tpp",
        "csharp": "cs csx",
        "ruby": "rb rake gemspec ru",
        "php": "php phtml php8",
        "kotlin": "kt kts",
        "swift": "swift",
        "scala": "scala sc sbt",
        "lua": "lua",
        "bash": "sh bash zsh ksh bats",
        "markdown": "md markdown mdown mkd mdx",
        "rst": "rst rest",
        "text": "txt text",
        "json": "json jsonc json5 jsonl ndjson ipynb",
        "yaml": "yaml yml",
        "toml": "toml",
        "html": "html htm xhtml vue svelte",
        "xml": "xml xsd xsl svg plist",
        "css": "css scss sass less",
        "sql": "sql",
        "ini": "ini cfg conf properties",
        "csv": "csv tsv",
        "make": "mk mak",
        "dockerfile": "dockerfile",
        "cmake": "cmake",
        "proto": "proto",
        "graphql": "graphql gql",
        "hcl": "tf tfvars hcl",
        "groovy": "groovy gradle",
        "perl": "pl pm",
        "r": "r",
        "julia": "jl",
        "elixir": "ex exs",
        "erlang": "erl hrl",
        "haskell": "hs",
        "ocaml": "ml mli",
        "dart": "dart",
        "zig": "zig",
        "nim": "nim",
        "clojure": "clj cljs cljc edn",
        "elisp": "el",
        "vim": "vim",
        "powershell": "ps1 psm1",
        "batch": "bat cmd",
        "latex": "tex",
        "objc": "m mm",
    }.items()
    for ext in exts.split()
}
FILENAMES = {
    "makefile": "make",
    "gnumakefile": "make",
    "dockerfile": "dockerfile",
    "containerfile": "dockerfile",
    "cmakelists.txt": "cmake",
    "rakefile": "ruby",
    "gemfile": "ruby",
    "podfile": "ruby",
    "vagrantfile": "ruby",
    "brewfile": "ruby",
    "jenkinsfile": "groovy",
    "pkgbuild": "bash",
    ".bashrc": "bash",
    ".bash_profile": "bash",
    ".bash_aliases": "bash",
    ".bash_logout": "bash",
    ".profile": "bash",
    ".zshrc": "bash",
    ".zprofile": "bash",
    ".zshenv": "bash",
    ".envrc": "bash",
    ".editorconfig": "ini",
    ".gitignore": "text",
    ".gitattributes": "text",
    ".dockerignore": "text",
    "readme": "text",
    "license": "text",
    "copying": "text",
    "authors": "text",
    "notice": "text",
}
