"""Built-in precision seasonings: FP16 and BF16 mixed precision."""

from __future__ import annotations

from routetune import hookimpl
from routetune.passes.precision.mixed import Bf16, Fp16
from routetune.registry import Registry


@hookimpl
def routetune_register_seasonings(registry: Registry) -> None:
    """Register fp16 and bf16."""
    registry.add_seasoning(Fp16)
    registry.add_seasoning(Bf16)
