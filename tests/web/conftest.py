"""One served fixture site per test session, shared by the browser and the plain-HTTP modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from uisite import Site, ui_site


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory, prefect_server: None) -> Iterator[Site]:
    with ui_site(tmp_path_factory.mktemp("ui")) as built:
        yield built
