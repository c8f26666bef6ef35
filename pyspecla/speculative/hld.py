"""The heavy-light (HLD) schedule of a draft tree, built by libspecla (`specla_hld_build`).

The schedule is one int32 array padded to a fixed `capacity` (layout: specla.h and
docs/hld-layout.md), passed to the tree-verify kernels as data. `build_schedule` returns a new
array; `build_schedule_into` rewrites a buffer the caller keeps (the same buffer every step, so a
captured GPU graph can replay with the new topology). `ScheduleView` (from the Python oracle
pyspecla.reference.hld) reads one by name.

An invalid tree or capacity raises UsageError with the library's message, e.g.
"specla_hld_build: parents[3] = 5 is not in [0, 3) (parents must be in topological order)"."""

from __future__ import annotations

import numpy as np

from .. import _native
from .._native import check, int32_ptr, lib
from ..errors import NativeError, UsageError
from ..reference.hld import ScheduleView, capacity_value, parent_array

__all__ = ["ScheduleView", "build_schedule", "build_schedule_into", "schedule_size"]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def schedule_size(capacity: int) -> int:
    """Ints of a schedule padded to `capacity`. Raises UsageError for capacity < 1 (or too large)."""
    if capacity is None:
        raise UsageError("schedule_size: capacity is required")
    capacity = capacity_value(capacity, 0, "schedule_size")
    size = lib.specla_hld_size(capacity) if _INT32_MIN <= capacity <= _INT32_MAX else -1
    if size < 0:
        raise UsageError(f"schedule_size: capacity = {capacity} is out of range (must be >= 1)")
    return size


def _native_parents(parents) -> np.ndarray:
    parents = parent_array(parents, "specla_hld_build")
    # Values beyond int32 cannot reach the library unchanged; they are invalid parents anyway.
    outside = np.flatnonzero((parents < _INT32_MIN) | (parents > _INT32_MAX))
    if len(outside):
        t = int(outside[0])
        raise UsageError(f"specla_hld_build: parents[{t}] = {parents[t]} is not in [0, {t}) "
                         "(parents must be in topological order)" if t else
                         f"specla_hld_build: parents[0] = {parents[0]} must be -1 (node 0 is the root)")
    return np.ascontiguousarray(parents, dtype=np.int32)


def build_schedule_into(parents, schedule: np.ndarray, capacity: int) -> np.ndarray:
    """Write the schedule of `parents` padded to `capacity` into `schedule` (1-D C-contiguous
    int32 with at least schedule_size(capacity) entries; later entries are left alone) and return it."""
    if not isinstance(schedule, np.ndarray) or schedule.ndim != 1 or schedule.dtype != np.int32 \
            or not schedule.flags.c_contiguous or not schedule.flags.writeable:
        raise UsageError("build_schedule_into: schedule must be a writeable 1-D C-contiguous int32 array")
    parents = _native_parents(parents)
    capacity = capacity_value(capacity, len(parents), "specla_hld_build")
    if not _INT32_MIN <= capacity <= _INT32_MAX:
        raise UsageError(f"specla_hld_build: capacity = {capacity} is out of range")
    n_ints = min(len(schedule), _INT32_MAX)
    # An empty tree still goes to the library, whose message names it; ctypes needs a valid pointer.
    parents_buffer = parents if len(parents) else np.full(1, -1, dtype=np.int32)
    try:
        check(lib.specla_hld_build(int32_ptr(parents_buffer), len(parents), capacity, int32_ptr(schedule), n_ints))
    except NativeError as error:
        if error.status == _native.ERR_INVALID_ARGUMENT:
            raise UsageError(str(error)) from None
        raise
    return schedule


def build_schedule(parents, capacity: int | None = None) -> np.ndarray:
    """The packed schedule of the tree `parents` (parents[0] = -1, 0 <= parents[t] < t), padded to
    `capacity` (default: the tree's size), as a new int32 array of schedule_size(capacity) ints."""
    parents = _native_parents(parents)
    capacity = capacity_value(capacity, len(parents), "specla_hld_build")
    size = lib.specla_hld_size(capacity) if _INT32_MIN <= capacity <= _INT32_MAX else -1
    # A bad capacity still goes to the library (with a 1-int buffer), whose message names it.
    schedule = np.full(max(size, 1), -1, dtype=np.int32)
    return build_schedule_into(parents, schedule, capacity)
