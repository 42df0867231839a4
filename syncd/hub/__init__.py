"""The reference control plane (``syncd hub``)."""
