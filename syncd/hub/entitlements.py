"""What the hub's ``GET /v1/agent/entitlement`` signs: an entitlement for one device of one
token, with ``features`` from the token's plan.

Rules:
  * The token is found by its SHA-256 (a bearer token, or the page session's owner); one that is
    gone (revoked since) is a 401.
  * A plan not in ``PLANS`` (the tokens file or table was edited by hand) grants nothing: 500
    ``bad_plan``, never a token.
  * Valid from ``NBF_SLACK_SECS`` before issue (for clocks slightly behind) for the configured
    lifetime; ``seq`` comes from the store's durable counter, so a later entitlement always
    outranks an earlier one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol.errors import SyncdError
from syncd.entitlement.token import Claims, public_key_text, sign
from syncd.http.errors import Unauthorized
from syncd.hub.store import HubStore
from syncd.hub.tokens import PLANS

NBF_SLACK_SECS = 300
SEQ_COUNTER = "entitlement_seq"


class BadPlan(SyncdError):
    status, code = 500, "bad_plan"


class Issuer:
    """Signs entitlements with the hub's key (``key``) for ``lifetime_days``."""

    def __init__(self, hub: HubStore, key: Ed25519PrivateKey, lifetime_days: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.hub, self.key, self.lifetime_days, self._clock = hub, key, lifetime_days, clock

    def public_key(self) -> str:
        return public_key_text(self.key.public_key())

    async def issue(self, token_sha256: str, device_id: str) -> dict[str, object]:
        """``{"token", "claims"}`` for ``device_id`` of the token whose SHA-256 is given."""
        found = await self.hub.tokens.lookup_hash(token_sha256)
        if found is None:
            raise Unauthorized("unknown token")
        name, _, plan = found
        features = PLANS.get(plan)
        if features is None:
            raise BadPlan(f"token {name!r} has plan {plan!r}, which is not one of "
                          f"{', '.join(PLANS)}")
        now = int(self._clock())
        claims = Claims(sub=name, device_id=device_id, plan=plan, features=list(features),
                        iat=now, nbf=now - NBF_SLACK_SECS,
                        exp=now + int(self.lifetime_days * 86400),
                        seq=await self.hub.next_counter(SEQ_COUNTER))
        return {"token": sign(self.key, claims), "claims": claims}
