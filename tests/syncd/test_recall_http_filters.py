"""Recall filters SQLite cannot run are a 422 naming the field, never a 500."""

from __future__ import annotations

import pytest

from tests.syncd.conftest import Daemon


@pytest.mark.parametrize("field", ["tags", "realms"])
async def test_a_thousand_filters_are_a_validation_error_not_a_500(daemon: Daemon,
                                                                   field: str) -> None:
    await daemon.store.memories.save({"content": "deploy billing with make release", "tags": ["t1"]})
    status, body, _ = await daemon.call("POST", "/v1/agent/memory/query", json={
        "query": "deploy billing", field: [f"t{i}" for i in range(1000)]})
    assert status == 422, (status, body)
    assert isinstance(body, dict) and body["error"]["field"] == field
