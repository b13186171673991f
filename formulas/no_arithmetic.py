"""The one table of ops that do no arithmetic, each with how it touches memory.

NONE: views, reshapes, metadata and uninitialised allocation move no bytes.
COPY: reads its tensor inputs, writes its outputs (clone, cat, dtype/device copies).
WRITE: writes its outputs and reads nothing (zeros, ones, fill_).
"""

from __future__ import annotations

import torch

from ._registry import REGISTRY, Movement

aten = torch.ops.aten


def _ops(names: str):
    found = []
    for name in names.split():
        op = getattr(aten, name, None)
        if op is not None:  # ops come and go across torch versions
            found.append(op)
    return found


VIEW_OPS = _ops(
    """
    view _unsafe_view reshape _reshape_alias as_strided alias t transpose permute expand
    expand_as unsqueeze squeeze select slice narrow unbind split split_with_sizes chunk
    unflatten flatten view_as diagonal movedim detach lift_fresh unfold real imag view_as_real
    view_as_complex _conj _neg_view resolve_conj resolve_neg indices values crow_indices
    col_indices _indices _values numpy_T mT mH matrix_H adjoint tensor_split hsplit vsplit
    swapaxes swapdims
    """
)
METADATA_OPS = _ops(
    """
    sym_size sym_stride sym_numel sym_storage_offset size stride numel dim is_contiguous
    is_same_size is_nonzero _local_scalar_dense item _has_compatible_shallow_copy_type
    is_complex is_floating_point is_conj is_neg _nested_tensor_size set_ resize_ resize_as_
    _resize_output_ record_stream
    """
)
ALLOCATION_OPS = _ops(
    """
    empty empty_like empty_strided new_empty new_empty_strided empty_permuted
    """
)
COPY_OPS = _ops(
    """
    clone copy copy_ _to_copy contiguous cat stack _copy_from _copy_from_and_resize to
    lift lift_fresh_copy detach_copy view_copy t_copy transpose_copy permute_copy expand_copy
    unsqueeze_copy squeeze_copy slice_copy select_copy alias_copy as_strided_copy
    _unsafe_view_copy unbind_copy split_copy split_with_sizes_copy diagonal_copy
    """
)
WRITE_OPS = _ops(
    """
    zeros zeros_like ones ones_like full full_like fill fill_ zero_ new_zeros new_ones new_full
    scalar_tensor arange linspace logspace eye
    """
)

REGISTRY.no_arithmetic(VIEW_OPS + METADATA_OPS + ALLOCATION_OPS, Movement.NONE)
REGISTRY.no_arithmetic(COPY_OPS, Movement.COPY)
REGISTRY.no_arithmetic(WRITE_OPS, Movement.WRITE)
