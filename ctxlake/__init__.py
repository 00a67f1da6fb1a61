"""ctxlake: a local context lake for AI coding agents (the `ctx` command)."""

from pathlib import Path

__version__ = "0.1.0"

# In a source checkout the subpackages live beside this folder (flows/ tasks/ schemas/ serve/),
# and a process started in the checkout root imports this folder before the installed mapping.
# Searching the checkout root as well makes `ctxlake.tasks` resolve to ./tasks either way.
_root = Path(__file__).resolve().parent.parent
if (_root / "pyproject.toml").is_file() and (_root / "tasks" / "__init__.py").is_file():
    __path__.append(str(_root))
