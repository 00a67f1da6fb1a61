"""Ranking internals on hand-made catalogs: name, path and file-name evidence, file scores, fusion, tests."""

from __future__ import annotations

import math

import pytest

from ctxlake.serve.api.query_terms import analyse
from ctxlake.serve.api.ranking import (
    VARIANTS,
    LakeCatalog,
    RankOptions,
    cochange_scores,
    down_weight_tests,
    file_scores,
    folder_scores,
    is_test_path,
    neighbour_scores,
    ordered,
    path_scores,
    rrf,
    stem_scores,
    symbol_scores,
    wants_tests,
)

P = "project"
CATALOG = LakeCatalog.build([
    (P, "requests/sessions.py", "Session.resolve_redirects"),
    (P, "requests/sessions.py", "Session.request"),
    (P, "requests/models.py", "Response.text"),
    (P, "requests/models.py", "Request.prepare, Request.__init__"),
    (P, "requests/adapters.py", "HTTPAdapter.send"),
    (P, "requests/packages/urllib3/response.py", "HTTPResponse.read"),
    (P, "requests/packages/urllib3/response.py", "HTTPResponse.text"),
    (P, "sympy/printing/latex.py", "latex"),
    (P, "sympy/printing/latex.py", "LatexPrinter._print_Pow"),
    (P, "sympy/core/power.py", "Pow"),
    (P, "pkg/widgets/__init__.py", None),
    (P, "tests/test_sessions.py", "test_resolve_redirects"),
])


def test_catalog_indexes_definitions_stems_and_names() -> None:
    assert CATALOG.defines["resolve_redirects"] == {(P, "requests/sessions.py")}
    assert CATALOG.defines["Session.resolve_redirects"] == {(P, "requests/sessions.py")}
    # Merged chunks list several names; each counts.
    assert CATALOG.defines["prepare"] == {(P, "requests/models.py")}
    assert CATALOG.defines["text"] == {(P, "requests/models.py"), (P, "requests/packages/urllib3/response.py")}
    assert CATALOG.by_stem["widgets"] == {(P, "pkg/widgets/__init__.py")}  # a package is named by its folder
    assert CATALOG.by_name["response.py"] == {(P, "requests/packages/urllib3/response.py")}
    assert len(CATALOG.files) == 8 and CATALOG.idf(1) == pytest.approx(math.log(1 + 8 / 1))


def test_symbol_evidence_prefers_rare_exact_definitions() -> None:
    scores = symbol_scores(analyse("`Session.resolve_redirects` copies the request; also check `text`"), CATALOG)
    best = ordered(scores)[0][0]
    assert best == (P, "requests/sessions.py")
    # `text` is defined in two files: each gets less than the one file defining resolve_redirects.
    assert scores[(P, "requests/models.py")] < scores[(P, "requests/sessions.py")]
    assert symbol_scores(analyse("nothing here is code"), CATALOG) == {}


def test_path_evidence_from_traceback_and_dotted_modules() -> None:
    tb = 'File "/venv/lib/site-packages/requests/models.py", line 3, in text\n'
    scores = path_scores(analyse(tb), CATALOG)
    assert ordered(scores)[0][0] == (P, "requests/models.py")
    dotted = path_scores(analyse("see requests.adapters.HTTPAdapter for details"), CATALOG)
    assert set(dotted) == {(P, "requests/adapters.py")}
    # A bare name shared by no file, or a pseudo path, says nothing.
    assert path_scores(analyse('File "<stdin>", line 1, in <module>'), CATALOG) == {}


def test_file_and_folder_name_evidence() -> None:
    scores = stem_scores(analyse("the LaTeX printer: latex(exp(-x)) differs from pretty"), CATALOG)
    assert ordered(scores)[0][0] == (P, "sympy/printing/latex.py")
    # A package's __init__ is named by its folder; other files by their folders only in folder_scores.
    assert set(stem_scores(analyse("the widgets package"), CATALOG)) == {(P, "pkg/widgets/__init__.py")}
    printing = folder_scores(analyse("every printing function"), CATALOG)
    assert set(printing) == {(P, "sympy/printing/latex.py")}


def test_file_scores_add_a_share_of_further_chunks() -> None:
    rows = [{"source": P, "path": "a.py", "_rank_score": 10.0}, {"source": P, "path": "b.py", "_rank_score": 9.0},
            {"source": P, "path": "b.py", "_rank_score": 8.0}, {"source": P, "path": "b.py", "_rank_score": 7.0}]
    assert file_scores(rows, 0.0, 3) == {(P, "a.py"): 10.0, (P, "b.py"): 9.0}
    assert file_scores(rows, 0.2, 1) == {(P, "a.py"): 10.0, (P, "b.py"): pytest.approx(9.0 + 0.2 * 8.0)}
    assert file_scores(rows, 0.2, 3)[(P, "b.py")] == pytest.approx(9.0 + 0.2 * 15.0)


def test_weighted_rrf_by_hand() -> None:
    a = {(P, "x"): 3.0, (P, "y"): 2.0}
    b = {(P, "y"): 0.9}
    fused = rrf([(a, 1.0), (b, 0.5), ({}, 1.0), ({(P, "z"): 1.0}, 0.0)], k=10)
    assert fused == {(P, "x"): pytest.approx(1 / 11), (P, "y"): pytest.approx(1 / 12 + 0.5 / 11)}


def test_test_paths_and_queries_about_tests() -> None:
    for path in ("tests/test_x.py", "pkg/tests/helpers.py", "testing/python/collect.py", "src/x_test.go",
                 "conftest.py", "web/app.spec.ts", "a/test_b.py"):
        assert is_test_path(path), path
    for path in ("src/_pytest/python.py", "pkg/testament.py", "lib/contest.py", "latest/x.py"):
        assert not is_test_path(path), path
    assert wants_tests("where are the fixtures for sessions") and not wants_tests("resolve redirects")
    assert not wants_tests("a long issue text " * 5 + "and a test")  # issue texts mention tests in passing
    scores = down_weight_tests({(P, "tests/test_a.py"): 1.0, (P, "a.py"): 0.6}, 0.5)
    assert ordered(scores)[0][0] == (P, "a.py")


def test_variants_turn_one_technique_over() -> None:
    full = RankOptions()
    for name in VARIANTS:
        assert full.variant(name) != full, name
    assert full.variant("-test_weight").test_weight == 1.0
    assert full.variant("+file_sum").file_sum_weight > 0 and full.file_sum_weight == 0
    plain = full.plain()
    assert not (plain.title_list or plain.identifier_list or plain.symbol_evidence or plain.path_evidence)
    assert plain.test_weight == 1.0
    with pytest.raises(ValueError):
        full.variant("-magic")


def test_import_neighbours_pass_rank_to_what_the_top_files_import() -> None:
    test, sessions, models, compat = ((P, p) for p in ("tests/test_sessions.py", "requests/sessions.py",
                                                      "requests/models.py", "requests/compat.py"))
    fused = {test: 0.05, sessions: 0.03, models: 0.01}
    imports = {test: {sessions}, sessions: {models, compat}, models: {compat}}
    got = neighbour_scores(fused, imports, hits=2)
    # the first file imports one file (1/1); the second shares 1/2 between its two imports
    assert got == pytest.approx({sessions: 1.0, models: 0.5 / math.sqrt(2), compat: 0.5 / math.sqrt(2)})
    assert neighbour_scores(fused, imports, hits=0) == {} and neighbour_scores(fused, {}, hits=5) == {}


def test_cochange_partners_of_the_top_files_gain() -> None:
    a, b, c, d = ((P, p) for p in ("a.py", "b.py", "c.py", "d.py"))
    fused = {a: 0.05, b: 0.03, c: 0.01}
    pairs = {a: {c: 0.5}, b: {c: 0.25, d: 0.75}, c: {a: 0.5}}
    got = cochange_scores(fused, pairs, hits=2)
    # a (rank 1) has one partner; b (rank 2) shares 1/2 between two, each scaled by its strength
    assert got == pytest.approx({c: 0.5 + 0.25 / 2 / math.sqrt(2), d: 0.75 / 2 / math.sqrt(2)})
    assert cochange_scores(fused, {}, hits=2) == {}


def test_prose_list_and_title_symbols_count_only_when_switched_on() -> None:
    from ctxlake.serve.api.file_search import FileEvidence, fuse_files

    a, b = (P, "a.py"), (P, "b.py")
    row = {"source": P, "start_line": 1, "end_line": 2, "symbol": None}
    evidence = FileEvidence(keyword=[{**row, "path": "a.py", "_rank_score": 2.0}],
                            prose=[{**row, "path": "b.py", "_rank_score": 3.0},
                                   {**row, "path": "a.py", "_rank_score": 1.0}],
                            title_symbol={b: 50.0})
    off = RankOptions(title_list=False, identifier_list=False, semantic_weight=0.0)
    assert [key for key, _ in fuse_files(evidence, off)] == [a]
    prose = dict(fuse_files(evidence, off.variant("+prose_list")))
    k = off.rrf_k
    assert prose == pytest.approx({a: 1 / (k + 1) + 1 / (k + 2), b: 1 / (k + 1)})
    named = dict(fuse_files(evidence, off.variant("+title_symbols")))
    assert named[b] == pytest.approx(50 / 55 / (k + 1)) and named[a] == pytest.approx(1 / (k + 1))


def test_one_edit_apart_takes_one_added_dropped_changed_or_swapped_letter() -> None:
    from ctxlake.serve.api.ranking import one_edit_apart

    for a, b in (("matematica", "mathematica"), ("mathematica", "matematica"), ("sqlmigrat", "sqlmigrate"),
                 ("widgest", "widgets"), ("autodocx", "autodoc"), ("formating", "formatting"), ("abxdef", "abcdef")):
        assert one_edit_apart(a, b), (a, b)
    for a, b in (("same", "same"), ("abcd", "dcba"), ("widgets", "gadgets"), ("ab", "abcd"), ("abcdef", "abxdex")):
        assert not one_edit_apart(a, b), (a, b)


def test_typo_and_title_stems_name_modules() -> None:
    from ctxlake.serve.api.ranking import module_stem_scores, typo_stem_scores

    catalog = LakeCatalog.build([(P, "sympy/printing/mathematica.py", "mcode"), (P, "sympy/printing/latex.py", "latex"),
                                 (P, "pkg/widgets/__init__.py", None), (P, "pkg/widgets/render.py", "render")])
    typo = typo_stem_scores(analyse("the matematica printer and the latex printer"), catalog)
    assert set(typo) == {(P, "sympy/printing/mathematica.py")}
    # a word that names a file itself, or one too short to trust, finds nothing one edit away
    assert typo_stem_scores(analyse("mathematica and latx"), catalog) == {}
    # a package's __init__ is named by its folder for stem evidence, but is not a module named so
    assert (P, "pkg/widgets/__init__.py") in stem_scores(analyse("widgets render"), catalog)
    assert set(module_stem_scores(analyse("widgets render"), catalog)) == {(P, "pkg/widgets/render.py")}


def test_score_fusion_scales_each_list_between_its_best_and_worst() -> None:
    from ctxlake.serve.api.ranking import scaled

    a, b, c = (P, "a.py"), (P, "b.py"), (P, "c.py")
    k = 60
    fused = scaled([({a: 10.0, b: 9.0, c: 0.0}, 1.0), ({c: 0.9, a: 0.5}, 0.5)], k)
    assert fused == pytest.approx({a: 1 / (k + 1), b: 0.9 / (k + 1), c: 0.5 / (k + 1)})
    # a list of one file (no spread) gives it a first place
    assert scaled([({a: 2.0}, 1.0)], k) == pytest.approx({a: 1 / (k + 1)})


def test_title_calls_name_the_first_called_name_that_the_lake_defines() -> None:
    from ctxlake.serve.api.ranking import called_name_scores

    catalog = LakeCatalog.build([(P, "sympy/printing/ccode.py", "ccode"), (P, "sympy/functions/trig.py", "sinc"),
                                 (P, "lib/matplotlib/__init__.py", "get_backend"), (P, "a.py", "helper")])
    assert set(called_name_scores("ccode(sinc(x)) doesn't work", catalog)) == {(P, "sympy/printing/ccode.py")}
    # a dotted call names its last part; a call of a name the lake does not define is passed over
    assert set(called_name_scores("print(plt.get_backend())", catalog)) == {(P, "lib/matplotlib/__init__.py")}
    assert called_name_scores("get_backend clears figures", catalog) == {}
