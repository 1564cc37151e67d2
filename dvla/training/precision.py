"""Which autocast to run under: `--mixed_precision auto | bf16 | no`.

bf16 autocast is the fast path on GPUs and on CPUs with native bf16 (AVX-512 class: Intel AMX or
AVX512-BF16), where a training step runs several times faster than in fp32. On a CPU without it
(an AVX2-only AMD EPYC, most laptops) oneDNN emulates bf16 and the same step runs about 10x *slower*
than fp32, so "auto" picks fp32 there.
"""

from __future__ import annotations

import contextlib
import os
import warnings

import torch

PRECISIONS = ("auto", "bf16", "no")


def check_precision(value) -> str:
    """The setting as one of PRECISIONS. YAML reads a bare `no` as False, which the config parser
    then turns into the string "False"; both mean "no"."""
    if value is False or value == "False":
        return "no"
    if value not in PRECISIONS:
        raise ValueError(f"mixed_precision must be one of {PRECISIONS}, got {value!r}")
    return value


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU runs bf16 matmuls natively (AVX-512 class), not by emulation.
    DVLA_CPU_BF16=0 (or 1) overrides the detection, e.g. to time the fp32 path that CPUs without
    native bf16 take."""
    forced = os.environ.get("DVLA_CPU_BF16")
    if forced in ("0", "1"):
        return forced == "1"
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return False
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(supported()) if supported is not None else True


def resolve_precision(value: str, device: torch.device) -> str:
    """ "bf16" or "no" for `device`; warns when bf16 is asked for on a CPU that emulates it."""
    value = check_precision(value)
    fast = device.type == "cuda" or (device.type == "cpu" and cpu_has_fast_bf16())
    if value == "auto":
        return "bf16" if fast else "no"
    if value == "bf16" and not fast and device.type == "cpu":
        warnings.warn(
            f"bf16 autocast on this CPU ({torch.backends.cpu.get_cpu_capability()}, no native bf16) is "
            "about 10x slower than fp32; use --mixed_precision auto or no",
            stacklevel=2,
        )
    return value


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on `device` for a resolved "bf16", else nothing."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
