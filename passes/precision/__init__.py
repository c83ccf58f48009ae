"""Built-in precision seasonings: FP16 and BF16 mixed precision, and precision repair."""

from __future__ import annotations

from routetune import hookimpl
from routetune.passes.precision.mixed import Bf16, Fp16
from routetune.passes.precision.repair import PrecisionRepair
from routetune.registry import Registry


@hookimpl
def routetune_register_seasonings(registry: Registry) -> None:
    """Register fp16, bf16 and precision-repair."""
    registry.add_seasoning(Fp16)
    registry.add_seasoning(Bf16)
    registry.add_seasoning(PrecisionRepair)
