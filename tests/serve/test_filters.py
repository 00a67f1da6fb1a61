"""Pure query-building helpers of serve/api/ranked_lists.py: glob translation, SQL filters, keyword expansion."""

from __future__ import annotations

import re

from ctxlake.serve.api.ranked_lists import build_filter, glob_to_regex, keyword_query


def test_glob_and_filter_translation() -> None:
    cases = {
        "src/**/*.py": (["src/a.py", "src/x/y/b.py"], ["lib/src/a.py", "src/a.pyc"]),
        "*.md": (["README.md", "docs/x.md"], ["docs/x.mdx"]),
        "docs/?.txt": (["docs/a.txt"], ["docs/ab.txt", "docs/a/b.txt"]),
        "web/[ab]*.js": (["web/app.js", "web/b.js"], ["web/c.js"]),
    }
    for glob, (good, bad) in cases.items():
        rx = re.compile(glob_to_regex(glob))
        assert all(rx.match(p) for p in good), glob
        assert not any(rx.match(p) for p in bad), glob
    assert build_filter(None, "Python", ["a", "o'b"]) == "lang = 'python' AND source IN ('a', 'o''b')"
    assert keyword_query("why does getUserById fail") == "why does getUserById fail get user by id"


