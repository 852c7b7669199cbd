"""What the CPU can do for reduced precision, as one ordered level (:data:`LEVELS`), and a way to cap it.

The CPU paths that differ by hardware (which modes ``auto`` tries, which int8 activation range
is safe) read one value, :func:`cpu_level`, so that a machine can be made to behave like a
smaller one, in tests and by users who want the same behaviour everywhere. What each level does,
and the caps (``CLIPSEARCH_CPU_CAP``, oneDNN's ``ONEDNN_MAX_CPU_ISA``, fbgemm's
``FBGEMM_ENABLE_INSTRUCTIONS``): docs/performance.md, "CPUs: levels and caps". Detected from
``/proc/cpuinfo`` (x86 flags; any other architecture is ``none`` until an int8 path is measured
there). Below the levels, each int8 kernel is tried once per process on a product built to
saturate 16-bit pair sums (:func:`retrieval.encoders.int8.full_codes_saturate`,
``numpy_text.int8.full_inputs_saturate``).
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

from ..errors import InvalidArgumentError

CAP_ENV = "CLIPSEARCH_CPU_CAP"
LEVELS: tuple[str, ...] = ("none", "avx2", "avx_vnni", "avx512_vnni", "amx")

# oneDNN's ISA names (lower case) whose kernels have no int8 dot product, most capable first
# where a prefix is shared; see oneDNN's "CPU dispatcher control".
_ONEDNN_ISA_LEVEL: tuple[tuple[str, str], ...] = (
    ("avx10", "amx"),  # AVX10.1 and later: Granite Rapids and newer
    ("avx512_core_amx", "amx"),
    ("avx512_core_fp16", "avx512_vnni"),
    ("avx512_core_bf16", "avx512_vnni"),
    ("avx512_core_vnni", "avx512_vnni"),
    ("avx512_core", "avx2"),  # AVX-512 without VNNI: vpmaddubsw, like AVX2
    ("avx2_vnni_2", "avx_vnni"),
    ("avx2_vnni", "avx_vnni"),
    ("avx2", "avx2"),
    ("avx", "none"),
    ("sse41", "none"),
    ("default", "amx"),  # no cap
)


@functools.lru_cache(maxsize=4)
def cpuinfo(field: str) -> str:
    """The first ``field`` line's value in /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return next((line.partition(":")[2].strip() for line in text.splitlines() if line.startswith(field)), "")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    return frozenset(cpuinfo("flags").split())


def level_of_flags(flags: frozenset[str], machine: str | None = None) -> str:
    """The level an x86 CPU with these ``/proc/cpuinfo`` flags has (``none`` elsewhere)."""
    arch = (machine if machine is not None else platform.machine()).lower()
    if arch not in ("x86_64", "amd64"):
        return "none"
    if {"amx_bf16", "amx_int8"} <= flags:
        return "amx"
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    if "avx_vnni" in flags:
        return "avx_vnni"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "none"


def rank(level: str) -> int:
    """Position of ``level`` in :data:`LEVELS` (higher can do more)."""
    return LEVELS.index(level)


def _check_cap(value: str) -> str:
    level = value.strip().lower()
    if level not in LEVELS:
        raise InvalidArgumentError(f"{CAP_ENV}={value!r} is not a CPU level; use one of {', '.join(LEVELS)}")
    return level


def _onednn_cap() -> str | None:
    value = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    if not value:
        return None
    isa = value.strip().lower()
    for prefix, level in _ONEDNN_ISA_LEVEL:
        if isa.startswith(prefix):
            return level
    return "none"  # a name we do not know: assume the least


def detected_level() -> str:
    """The level of this CPU, before any cap."""
    return level_of_flags(cpu_flags())


def _lower(level: str, cap: str | None) -> str:
    return cap if cap is not None and rank(cap) < rank(level) else level


def kernel_level() -> str:
    """The level oneDNN's kernels run at: the detected one, capped by ``ONEDNN_MAX_CPU_ISA``.

    This, not :func:`cpu_level`, says whether 8-bit int8 codes would saturate in them.
    """
    return _lower(detected_level(), _onednn_cap())


def cpu_level() -> str:
    """The level clipsearch acts on: the detected one, capped by the environment (module docstring).

    Raises:
        InvalidArgumentError: ``CLIPSEARCH_CPU_CAP`` holds an unknown level.
    """
    cap = os.environ.get(CAP_ENV)
    return _lower(kernel_level(), _check_cap(cap) if cap else None)


def at_least(level: str) -> bool:
    """Whether the CPU's level, after the caps, is ``level`` or higher."""
    return rank(cpu_level()) >= rank(level)


def has_int8_dot() -> bool:
    """Int8 dot products without 16-bit saturation (VNNI or AMX), after the caps."""
    return at_least("avx_vnni")


# fbgemm's own ISA cap (its AVX2, AVX512 and AVX512_256 kernels sum pairs in 16 bits).
FBGEMM_ENV = "FBGEMM_ENABLE_INSTRUCTIONS"


def fbgemm_has_int8_dot() -> bool:
    """Whether torch's fbgemm int8 kernels (the numpy text tower's) have int8 dot products at
    this level: AVX-512 VNNI or AMX after the caps. fbgemm has kernels for AVX2, AVX-512 and
    AVX-512 VNNI only, so an AVX-VNNI CPU runs its AVX2 ones, which saturate 16-bit pair sums.
    (Its own cap, :data:`FBGEMM_ENV`, is caught by the text tower's probe of the kernel.)"""
    return at_least("avx512_vnni")


def has_fast_int8() -> bool:
    """Int8 products faster than fp32 (AVX2 and up), after the caps."""
    return at_least("avx2")


def has_bf16() -> bool:
    """bf16 instructions (AVX-512 BF16 or AMX) on this CPU, unless a cap below ``avx512_vnni``
    rules them out (OpenVINO's int8 tower runs its other layers in bf16 where this holds)."""
    flags = cpu_flags()
    return bool({"avx512_bf16", "amx_bf16"} & flags) and at_least("avx512_vnni")


def describe() -> dict[str, str]:
    """The detected and the effective level, and the cap that made them differ (for ``info``)."""
    data = {"detected": detected_level(), "level": cpu_level()}
    if os.environ.get(CAP_ENV):
        data["cap"] = os.environ[CAP_ENV]
    if _onednn_cap() is not None:
        data["onednn_cap"] = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA", "")
    if os.environ.get(FBGEMM_ENV):
        data["fbgemm_cap"] = os.environ[FBGEMM_ENV]
    return data


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one, else all)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


__all__ = [
    "CAP_ENV",
    "FBGEMM_ENV",
    "LEVELS",
    "at_least",
    "cpu_flags",
    "cpu_level",
    "cpuinfo",
    "describe",
    "detected_level",
    "fbgemm_has_int8_dot",
    "has_bf16",
    "has_fast_int8",
    "has_int8_dot",
    "usable_cores",
    "kernel_level",
    "level_of_flags",
    "rank",
]
