"""Which stored MESSAGES rows carry their file's modification time instead of a timestamp of their own.

Cursor's agent transcripts and Antigravity's artifacts have no timestamps: their scrapers stamp each row with
the file's mtime when first read. The read side flags such sessions (`time_estimated`) and never lets them
outrank a session with real message times from the same day.
"""

from __future__ import annotations

# tool -> SQL condition over MESSAGES, true for the rows stamped with their file's time.
FILE_TIME_ROWS: dict[str, str] = {
    "cursor": "source_file NOT LIKE '%.vscdb'",  # the IDE's state.vscdb rows have real times; transcripts do not
    "antigravity": "kind = 'artifact'",  # step logs carry created_at; the markdown artifacts do not
}
