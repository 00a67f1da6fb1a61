#!/usr/bin/env python3
"""Bootstrap ctxlake from a fresh clone with nothing but Python 3.11 and pip.

    python3 dev.py demo            # venv + install, index this repository, show a search
    python3 dev.py test            # venv + dev install, ruff, mypy, pytest
    python3 dev.py bench index     # venv + dev install, run a benchmark (tests/bench/bench_*.py)

Dependencies are installed once per change of pyproject.toml (a stamp file in .venv); the
project itself is re-linked on every call (fast), so new modules are always importable.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")
DEMO_QUERY = "how does indexing skip files that did not change"


def say(msg: str) -> None:
    print(f"[dev] {msg}", file=sys.stderr, flush=True)


def run(*cmd: str | Path, cwd: Path = ROOT, check: bool = True, env: dict[str, str] | None = None) -> int:
    say(" ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], cwd=cwd, check=check, env=env).returncode


def ensure_venv(dev: bool) -> None:
    if sys.version_info[:2] != (3, 11):
        say(f"note: ctxlake is pinned to Python 3.11; this is {sys.version.split()[0]}")
    if not PY.exists():
        say(f"creating {VENV}")
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
        run(PY, "-m", "pip", "install", "-q", "--upgrade", "pip", "setuptools>=77", "wheel")
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    stamp = VENV / f".deps-{'dev' if dev else 'run'}-{digest}"
    target = ".[dev]" if dev else "."
    if not stamp.exists():
        say("installing dependencies (first time: a few minutes, mostly torch)")
        run(PY, "-m", "pip", "install", "-q", "-e", target, "--config-settings", "editable_mode=strict")
        for old in VENV.glob(".deps-*"):
            old.unlink()
        stamp.touch()
        if not dev:
            # A dev stamp implies the run set too.
            (VENV / f".deps-run-{digest}").touch()
    else:
        # Re-link the package tree (strict editable mode links files, so new modules need it).
        run(PY, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", ".",
            "--config-settings", "editable_mode=strict")


def ctx(*args: str, check: bool = True) -> int:
    return run(BIN / "ctx", *args, check=check)


def cmd_demo(args: list[str]) -> int:
    ensure_venv(dev=False)
    target = Path(args[0]).resolve() if args else ROOT
    query = args[1] if len(args) > 1 else DEMO_QUERY
    os.chdir(target)
    rc = run(BIN / "ctx", "run", "index", str(target), cwd=target, check=False)
    if rc != 0:
        return rc
    run(BIN / "ctx", "status", cwd=target, check=False)
    return run(BIN / "ctx", "search", query, "-n", "5", cwd=target, check=False)


def cmd_test(args: list[str]) -> int:
    ensure_venv(dev=True)
    rc = run(BIN / "ruff", "check", "ctxlake", "schemas", "tasks", "flows", "serve", "tests", "dev.py",
             check=False)
    link_tree = next((ROOT / "build").glob("__editable__.ctxlake-*"), None)
    if link_tree is None:
        say("no editable link tree under build/: cannot type-check")
        return 1
    rc |= run(BIN / "mypy", "-p", "ctxlake", "--config-file", str(ROOT / "pyproject.toml"), cwd=link_tree,
              check=False)
    ensure_chromium()
    pytest_args = args or ["-q"]
    test_rc = run(PY, "-m", "pytest", *pytest_args, check=False)
    if test_rc == 5:
        say("pytest collected no tests: that is a failure here")
        test_rc = 1
    return rc or test_rc


CHROMIUM = Path("/usr/bin/chromium")


def ensure_chromium() -> None:
    """The web UI's browser tests drive Debian's Chromium by path (Playwright's own browser download
    is never used): install it with apt-get when it is missing; else the tests skip with the reason."""
    if CHROMIUM.exists():
        return
    apt = shutil.which("apt-get")
    if apt is None:
        say(f"{CHROMIUM} is missing and apt-get is not available: the browser tests (tests/web) will be skipped")
        return
    sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if sudo is None:
        say(f"{CHROMIUM} is missing; install it as root (apt-get install -y chromium): browser tests will be skipped")
        return
    say("installing Debian's chromium for the web UI's browser tests (apt-get install -y chromium, about a minute)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if run(*sudo, apt, "install", "-y", "-q", "chromium", check=False, env=env) != 0:
        run(*sudo, apt, "update", "-q", check=False, env=env)
        if run(*sudo, apt, "install", "-y", "-q", "chromium", check=False, env=env) != 0:
            say("could not install chromium: the browser tests (tests/web) will be skipped with that reason")


def cmd_bench(args: list[str]) -> int:
    names = sorted(p.stem.removeprefix("bench_") for p in (ROOT / "tests" / "bench").glob("bench_*.py"))
    usage = f"usage: python3 dev.py bench NAME [args] (NAME --help for its options); NAME is one of: {', '.join(names)}"
    if not args or args[0] in ("-h", "--help"):
        say(usage)
        return 0 if args else 2
    script = ROOT / "tests" / "bench" / f"bench_{args[0]}.py"
    if not script.exists():
        say(f"no benchmark named {args[0]!r}; {usage}")
        return 2
    ensure_venv(dev=True)
    return run(PY, script, *args[1:], check=False)


def cmd_clean(_: list[str]) -> int:
    for path in (VENV, ROOT / "build"):
        shutil.rmtree(path, ignore_errors=True)
    return 0


COMMANDS = {"demo": cmd_demo, "test": cmd_test, "bench": cmd_bench, "clean-venv": cmd_clean}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        return COMMANDS[sys.argv[1]](sys.argv[2:])
    except subprocess.CalledProcessError as exc:
        say(f"failed: exit {exc.returncode}")
        return exc.returncode or 1


if __name__ == "__main__":
    sys.exit(main())
