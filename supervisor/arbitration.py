"""ROMA's supervisor, Algorithm 2 (Section 3): fit the controllers' demands to the node.

available cores AC = MC - GC (the node's cores minus those reserved to feed the GPUs);
eta = AC / sum(u). With eta < 1 every demand is scaled by eta (under-provisioning); with
eta >= 1 every demand is granted, and with spare_share gamma > 0 each model also gets that share
of the spare cores in proportion to its demand: u' = u (1 + gamma (eta - 1)), so gamma = 1 hands
out all of AC.
"""

from __future__ import annotations

from collections.abc import Mapping

# ROMA Section 3: "The default value (gamma = 0) implies that u' = u".
SPARE_SHARE = 0.0


def arbitrate(
    demands: Mapping[str, float],
    node_cores: float,
    reserved_cores: float = 0.0,
    spare_share: float = SPARE_SHARE,
) -> dict[str, float]:
    if not 0 <= spare_share <= 1:
        raise ValueError(f"spare_share must be in [0, 1], got {spare_share}")
    available = max(0.0, node_cores - reserved_cores)
    total = sum(demands.values())
    if total <= 0:
        return dict(demands)
    eta = available / total
    if eta < 1:
        return {name: u * eta for name, u in demands.items()}
    return {name: u * (1 + spare_share * (eta - 1)) for name, u in demands.items()}
