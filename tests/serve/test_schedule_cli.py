"""`ctx schedule` input checks and the service-down message; a bad [schedule] cron is a config error."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ctxlake.serve.service.schedules import parse_every


def test_bad_cron_is_refused_with_the_reason(cli: Callable[..., Any], tmp_path: Path) -> None:
    result = cli("schedule", "set", "sync_sources", "--cron", "0 25 * * *", cwd=tmp_path)
    assert result.exit_code == 2 and "Bad hour" in result.stderr
    result = cli("schedule", "set", "sync_sources", "--cron", "0 3 * *", cwd=tmp_path)
    assert result.exit_code == 2 and "5 fields" in result.stderr
    result = cli("schedule", "set", "sync_sources", "--every", "10 minutes", cwd=tmp_path)
    assert result.exit_code == 2 and "invalid interval" in result.stderr


def test_commands_say_to_start_the_service(cli: Callable[..., Any], tmp_path: Path, ctx_home: Path) -> None:
    for args in (["list"], ["pause", "ingest_conversations"], ["set", "ingest_conversations", "--every", "10m"]):
        result = cli("schedule", *args, cwd=tmp_path)
        assert result.exit_code == 1 and "ctx up" in result.stderr, args
    # A state file naming a server that is gone is the same as no service.
    (ctx_home / "service").mkdir(parents=True)
    (ctx_home / "service" / "service.json").write_text(json.dumps({"prefect_api_url": "http://127.0.0.1:9/api"}))
    result = cli("schedule", "list", "--json", cwd=tmp_path)
    assert result.exit_code == 1 and "not running" in result.stderr


def test_invalid_cron_in_config_is_a_config_error(cli: Callable[..., Any], tmp_path: Path) -> None:
    (tmp_path / ".ctx").mkdir()
    (tmp_path / ".ctx" / "config.toml").write_text('[schedule]\nsync_cron = "every day"\n', encoding="utf-8")
    result = cli("status", cwd=tmp_path)
    assert result.exit_code == 3 and "schedule.sync_cron" in result.stderr


@pytest.mark.parametrize(("text", "seconds"), [("60", 60), ("90s", 90), ("10m", 600), ("2h", 7200), ("1d", 86400)])
def test_parse_every(text: str, seconds: int) -> None:
    assert parse_every(text).total_seconds() == seconds


def test_an_interval_under_a_minute_is_refused(cli: Callable[..., Any], tmp_path: Path) -> None:
    for every in ("1s", "59", "0.5m"):
        result = cli("schedule", "set", "ingest_conversations", "--every", every, cwd=tmp_path)
        assert result.exit_code == 2 and "too short" in result.stderr and "60 s" in result.stderr, every


def test_an_interval_past_a_year_is_refused(cli: Callable[..., Any], tmp_path: Path) -> None:
    """99999999999d overflowed timedelta: an OverflowError traceback, exit 1."""
    for every in ("99999999999d", "367d"):
        result = cli("schedule", "set", "ingest_conversations", "--every", every, cwd=tmp_path)
        assert result.exit_code == 2 and "too long" in result.stderr, (every, result.stderr)
    assert parse_every("366d").days == 366


def test_a_config_interval_under_a_minute_is_a_config_error(tmp_path: Path) -> None:
    from ctxlake.errors import ConfigError
    from ctxlake.schemas.config import load_settings

    (tmp_path / ".ctx").mkdir()
    (tmp_path / ".ctx" / "config.toml").write_text("[schedule]\ningest_every_s = 1\n")
    with pytest.raises(ConfigError, match="ingest_every_s"):
        load_settings(tmp_path)
