"""The one table of ops that do no arithmetic, each with how it touches memory.

NONE: views, reshapes, metadata and uninitialised allocation move no bytes.
COPY: reads its tensor inputs, writes its outputs (clone, cat, dtype/device copies, padding,
      flips, and the gathers and scatters of indexing: ``gather``, ``index``).
      An indexing op is counted as reading its whole source (the rows its indices select
      are tensor values), except ``embedding``: ``partial.py`` counts the rows it looks up.
      ``copy``/``copy_``, ``index_copy_`` and ``embedding`` are declared in ``partial.py``
      with the bytes they really move.
WRITE: writes its outputs and reads nothing (zeros, ones, fill_).

Indexing that accumulates (``index_put`` with ``accumulate=True``, ``scatter_add``,
``index_add``) does arithmetic and is priced in ``indexing.py``.
"""

from __future__ import annotations

import torch

from ._registry import REGISTRY, Cost, Movement, namespace
from ._shapes import numel

aten = namespace("aten")  # ops this torch lacks read as names, never met


_LISTED: set = set()


def _ops(names: str):
    found = []
    for name in names.split():
        op = getattr(torch.ops.aten, name, None)
        if op is not None and op not in _LISTED:  # ops come and go across torch versions
            _LISTED.add(op)
            found.append(op)
    return found


VIEW_OPS = _ops(
    """
    view _unsafe_view reshape _reshape_alias as_strided alias t transpose permute expand
    expand_as unsqueeze squeeze select slice narrow unbind split split_with_sizes chunk
    unflatten flatten view_as diagonal movedim detach lift_fresh unfold real imag view_as_real
    view_as_complex _conj _neg_view resolve_conj resolve_neg indices values crow_indices
    col_indices _indices _values numpy_T mT mH matrix_H adjoint tensor_split hsplit vsplit
    swapaxes swapdims unsafe_split unsafe_split_with_sizes unsafe_chunk detach_ transpose_ t_
    squeeze_ unsqueeze_ as_strided_ swapaxes_ swapdims_ broadcast_tensors broadcast_to positive
    conj atleast_1d atleast_2d atleast_3d ravel dsplit requires_grad_ retain_grad _fw_primal
    _make_dual _unpack_dual reshape_as align_to rename rename_ refine_names
    """
)
METADATA_OPS = _ops(
    """
    sym_size sym_stride sym_numel sym_storage_offset size stride numel dim is_contiguous
    is_same_size is_nonzero _local_scalar_dense item _has_compatible_shallow_copy_type
    is_complex is_floating_point is_conj is_neg _nested_tensor_size set_ resize_ resize_as_
    _resize_output_ record_stream _assert_async _assert_scalar _functional_assert_async
    _functional_assert_scalar sym_constrain_range sym_constrain_range_for_size is_pinned
    is_inference is_set_to is_signed is_distributed _version output_nr sym_is_contiguous
    _nested_tensor_strides _nested_tensor_storage_offsets
    _nested_compute_contiguous_strides_offsets
    """
)
# TorchScript's tensor queries, which code running under a fake tensor mode meets (SDPA asks
# ``prim.device`` of its inputs): metadata, no bytes move
PRIM_METADATA_OPS = [
    op for op in (getattr(torch.ops.prim, name, None) for name in """
        device layout dtype type itemsize requires_grad data is_cuda is_cpu is_xpu is_mps
        is_meta is_sparse is_sparse_csr is_mkldnn is_quantized is_nested is_vulkan is_ipu
        is_maia is_mtia is_xla
        """.split()) if op is not None
]
# torch.profiler.record_function, which the optimizers' step() opens: bookkeeping only
PROFILER_OPS = [
    op for op in (getattr(torch.ops.profiler, name, None) for name in (
        "_record_function_enter", "_record_function_enter_new", "_record_function_exit"))
    if op is not None
]
ALLOCATION_OPS = _ops(
    """
    empty empty_like empty_strided new_empty new_empty_strided empty_permuted
    """
)
COPY_OPS = _ops(
    """
    clone _to_copy contiguous cat stack _copy_from _copy_from_and_resize to
    lift lift_fresh_copy detach_copy view_copy t_copy transpose_copy permute_copy expand_copy
    unsqueeze_copy squeeze_copy slice_copy select_copy alias_copy as_strided_copy
    _unsafe_view_copy unbind_copy split_copy split_with_sizes_copy diagonal_copy
    _reshape_copy narrow_copy unfold_copy _to_dense to_dense _pin_memory _foreach_copy
    _foreach_copy_ _chunk_cat block_diag diag diag_embed diagflat complex column_stack hstack
    vstack dstack type_as
    """
)
# layout conversions: sparse <-> dense, nested <-> padded or a list (they move what is stored)
CONVERSION_OPS = _ops(
    """
    _to_sparse to_sparse _to_sparse_csr to_sparse_csr _to_sparse_csc to_sparse_csc
    _to_sparse_bsr to_sparse_bsr _to_sparse_bsc to_sparse_bsc _coalesce coalesce
    _sparse_coo_tensor_with_dims_and_tensors _sparse_coo_tensor_unsafe sparse_coo_tensor
    _sparse_csr_tensor_unsafe _sparse_compressed_tensor_unsafe sparse_compressed_tensor
    _nested_tensor_from_tensor_list _nested_from_padded to_padded_tensor _nested_from_padded_tensor
    _nested_tensor_from_mask nested_to_padded_tensor _nested_from_padded_and_nested_example
    _jagged_to_padded_dense_forward _padded_dense_to_jagged_forward _nested_get_values_copy
    _nested_view_from_buffer_copy _nested_view_from_jagged_copy _nested_select_backward
    _nested_sum_backward _pack_padded_sequence _pack_padded_sequence_backward _pad_packed_sequence
    """
)
# views of what a sparse or nested tensor stores
STORAGE_VIEW_OPS = _ops(
    """
    _values _indices values indices crow_indices col_indices ccol_indices row_indices
    _nested_view_from_jagged _nested_get_values _nested_get_offsets _nested_get_lengths
    _nested_get_jagged_dummy _nested_get_ragged_idx _nested_view_from_buffer
    _nested_get_min_seqlen _nested_get_max_seqlen _nnz _dimI _dimV sparse_dim dense_dim
    is_coalesced _coalesced_ _linalg_check_errors
    """
)
# indexing: gathers and scatters that only move data
INDEXING_OPS = _ops(
    """
    gather index index_select masked_select take take_along_dim _unsafe_index
    index_copy index_fill index_fill_ masked_scatter masked_scatter_ select_scatter
    slice_scatter diagonal_scatter as_strided_scatter max_unpool2d max_unpool3d
    slice_backward select_backward diagonal_backward _unsafe_masked_index
    """
)
# layout: padding, flips, repeats, triangles, pixel shuffles, nearest upsampling, unfold
LAYOUT_OPS = _ops(
    """
    flip fliplr flipud roll rot90 repeat repeat_interleave tile constant_pad_nd pad
    reflection_pad1d reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d
    replication_pad3d _pad_circular _pad_enum tril triu tril_ triu_ pixel_shuffle
    pixel_unshuffle channel_shuffle native_channel_shuffle im2col upsample_nearest1d
    upsample_nearest2d upsample_nearest3d _upsample_nearest_exact1d _upsample_nearest_exact2d
    _upsample_nearest_exact3d
    """
)
WRITE_OPS = _ops(
    """
    zeros zeros_like ones ones_like full full_like fill fill_ zero_ new_zeros new_ones new_full
    scalar_tensor arange linspace logspace eye _foreach_zero_ _efficientzerotensor tril_indices
    triu_indices fill_diagonal_ _cudnn_init_dropout_state
    """
)

REGISTRY.no_arithmetic(VIEW_OPS + METADATA_OPS + ALLOCATION_OPS + PROFILER_OPS
                       + STORAGE_VIEW_OPS + PRIM_METADATA_OPS, Movement.NONE)
REGISTRY.no_arithmetic(COPY_OPS + INDEXING_OPS + LAYOUT_OPS + CONVERSION_OPS, Movement.COPY)
REGISTRY.no_arithmetic(WRITE_OPS, Movement.WRITE)


def _mask_check_bytes(t, mask, *, out_shape, dtypes=None) -> Cost:
    # is the padding mask left-aligned (every row's padding at its end)? reads the mask only
    itemsize = dtypes[1].itemsize if dtypes and dtypes[1] is not None else 1
    return Cost(0, bytes_read=numel(mask) * itemsize, bytes_written=1)


REGISTRY.no_arithmetic(aten.present(["_nested_tensor_from_mask_left_aligned"]), Movement.COPY,
                       bytes=_mask_check_bytes)
