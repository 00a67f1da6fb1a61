"""Query understanding: identifiers, dotted names, paths and traceback frames pulled out of issue texts."""

from __future__ import annotations

from ctxlake.serve.api.query_terms import (
    Frame,
    analyse,
    dotted_to_paths,
    is_code_identifier,
    normalise_path,
    query_prose,
    squeeze_repeats,
)

ISSUE = '''`Session.resolve_redirects` copies the original request for all subsequent requests

Because `Session.resolve_redirects` starts each iteration by copying the original request,
requests will issue a POST! See requests/sessions.py and the HTTPAdapter.

```
Traceback (most recent call last):
  File "/srv/me/.venv/lib/python2.7/site-packages/requests/models.py", line 721, in text
    if not self.content:
  File "C:\\Python27\\lib\\socket.py", line 380, in read
    data = self._sock.recv(left)
socket.error: [Errno 104] Connection reset by peer
```
'''


def test_identifiers_dotted_names_and_paths() -> None:
    a = analyse(ISSUE)
    assert a.identifiers["resolve_redirects"] >= 2 and a.identifiers["Session"] >= 2
    assert "HTTPAdapter" in a.identifiers  # a hump in prose marks a code name
    assert "Session.resolve_redirects" in a.dotted and "socket.error" in a.dotted
    assert "requests/sessions.py" in a.paths
    assert "srv/me/.venv/lib/python2.7/site-packages/requests/models.py" in a.paths
    # Plain prose words are words, not identifiers; stop names are never identifiers.
    assert "original" not in a.identifiers and "self" not in a.identifiers
    assert a.words["original"] >= 1 and a.code_like


def test_traceback_frames_in_order_with_functions() -> None:
    frames = analyse(ISSUE).frames
    assert frames[0] == Frame("srv/me/.venv/lib/python2.7/site-packages/requests/models.py", 721, "text")
    assert frames[1] == Frame("Python27/lib/socket.py", 380, "read")  # Windows path, drive dropped
    assert analyse(ISSUE).identifiers["text"] >= 1  # the frame's function counts as a name


def test_pytest_and_linter_locations() -> None:
    a = analyse("src/_pytest/python.py:1234: in pytest_pycollect_makeitem\n"
                "src\\gen\\about.py:12:0: C0103: Class name doesn't conform")
    assert Frame("src/_pytest/python.py", 1234, "pytest_pycollect_makeitem") in a.frames
    assert Frame("src/gen/about.py", 12, None) in a.frames


def test_repeated_log_lines_are_squeezed() -> None:
    log = "\n".join(f"src/gen/about.py:{i}:0: R2044: Line with empty comment" for i in range(50))
    squeezed = squeeze_repeats("intro\n" + log + "\nthe real problem is ignore-paths")
    assert squeezed.count("R2044") == 2
    assert squeezed.startswith("intro") and squeezed.endswith("ignore-paths")


def test_prose_drops_code_blocks_prompts_and_log_lines() -> None:
    prose = query_prose(ISSUE + "\n>>> s.get(url)\n    indented = code()\n{'a': [1, 2], 'b': (3, 4)}\nIt fails on 2.7 too.\n")
    assert prose is not None
    assert prose.startswith("`Session.resolve_redirects` copies") and prose.endswith("It fails on 2.7 too.")
    assert "Traceback" not in prose and "socket.error" not in prose and "self.content" not in prose
    assert ">>>" not in prose and "indented" not in prose and "{'a'" not in prose
    assert query_prose("one title line\n```\ncode only\n```") is None


def test_code_identifier_shapes() -> None:
    assert is_code_identifier("store_cv_values") and is_code_identifier("RidgeClassifierCV")
    assert is_code_identifier("__init__") and is_code_identifier("getUserById")
    assert not is_code_identifier("Python") and not is_code_identifier("a_") and not is_code_identifier("ok")


def test_dotted_names_map_to_module_paths() -> None:
    assert dotted_to_paths("sklearn.linear_model.RidgeClassifierCV") == [
        "sklearn/linear_model/RidgeClassifierCV.py", "sklearn/linear_model/RidgeClassifierCV/__init__.py",
        "sklearn/linear_model.py", "sklearn/linear_model/__init__.py",
    ]
    assert dotted_to_paths("x") == []


def test_normalise_path() -> None:
    assert normalise_path("./a/b.py") == "a/b.py"
    assert normalise_path("C:\\x\\y.py") == "x/y.py"
    assert normalise_path("../up.py") == "../up.py"


def test_abbreviations_are_not_dotted_names() -> None:
    assert analyse("classes, e.g. list or set, i.e. builtins; see np.concat").dotted == ["np.concat"]


def test_analysis_is_linear_in_a_long_token() -> None:
    import time

    from ctxlake.serve.api.query_terms import bound_query

    for text in ["a" * 200_000, "aB" * 100_000, "x(" * 100_000, "a_b" * 66_000, "a.b" * 66_000]:
        started = time.monotonic()
        analyse(text)
        assert time.monotonic() - started < 2, text[:6]
    short, note = bound_query("word " * 2000, 4000)
    assert len(short) <= 4000 and short.endswith("word") and note and "10,000 characters" in note
    assert bound_query("short") == ("short", None)
