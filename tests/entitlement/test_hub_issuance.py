"""The hub's entitlement route: bad input gets one error naming the field, issues nothing and
leaves the hub's store as it was; a good request binds the token to the device and plan."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from syncd.entitlement.token import pin, public_key_text, verify
from tests.entitlement.support import SigningHub
from tests.store_probe import dump_tables


async def get(hub: SigningHub, params: dict[str, str], token: str | None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session, session.get(
            hub.url + "/v1/agent/entitlement", params=params, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


@pytest.mark.parametrize("device", ["", " padded ", "x" * 129, "tab\there"])
async def test_a_bad_device_id_is_refused_naming_the_field(hub: SigningHub, device: str) -> None:
    """422 with field device_id; no seq is spent and the store is unchanged."""
    before = await dump_tables(hub.store)
    status, body = await get(hub, {"device_id": device}, hub.token)
    assert status == 422 and body["error"]["field"] == "device_id", body
    status, body = await get(hub, {}, hub.token)
    assert status == 422 and body["error"]["field"] == "device_id", body
    assert await dump_tables(hub.store) == before


async def test_no_token_gets_nothing(hub: SigningHub) -> None:
    """401 without a bearer token; 401 with an unknown one."""
    assert (await get(hub, {"device_id": "laptop-1"}, None))[0] == 401
    assert (await get(hub, {"device_id": "laptop-1"}, "syncd_unknown"))[0] == 401


async def test_a_token_is_bound_to_the_device_and_the_plan(hub: SigningHub) -> None:
    """The signed claims name the requesting device, the token's plan and a growing seq."""
    keys = pin([public_key_text(hub.key.public_key())])
    first, _ = await hub.issue("laptop-1")
    second, _ = await hub.issue("laptop-1")
    claims_1, claims_2 = verify(first, keys), verify(second, keys)
    assert claims_1.device_id == "laptop-1" and claims_1.sub == "laptops"
    assert claims_1.plan == "pro" and claims_1.features == ["sync", "graph"]
    assert claims_2.seq == claims_1.seq + 1
    assert claims_1.exp - claims_1.iat == 7 * 86_400
