"""Access gating: signed entitlement tokens and the gate that fails closed."""
