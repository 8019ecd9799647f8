"""How far a predicted cache clears one request of max_model_len, against the calculator's own error.

A cache predicted to hold one request with a few hundred MiB to spare is no answer when the prediction misses by
more than that. The fit half of the field corpus measures by how much: `MemoryConstants.kv_error_share`, the 90th
percentile of |predicted − logged| KV memory as a share of total × utilisation. A fit inside that band is "at
risk", with both figures; beyond it, "fits". A predicted shortfall stays "does not fit", whatever its size.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from harness.predict.budget import CapacityPrediction


class CacheMargin(BaseModel):
    """KV memory left after one request of max_model_len, and the calculator's error band on this GPU."""

    model_config = ConfigDict(extra="forbid")

    margin_bytes: int  # negative: short of one request
    band_bytes: int
    at_risk: bool


def cache_margin(capacity: CapacityPrediction, usable_bytes: int, error_share: float) -> CacheMargin:
    """`capacity` of the binding stage; the margin in whole blocks, as vLLM checks one request against them."""
    margin = (capacity.num_blocks - capacity.blocks_per_request) * capacity.bytes_per_block
    band = int(error_share * usable_bytes)
    return CacheMargin(margin_bytes=margin, band_bytes=band, at_risk=0 <= margin < band)
