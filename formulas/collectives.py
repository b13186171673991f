"""Communication: c10d and functional collectives, point-to-point ops, and FSDP2's copy-in/out.

Every collective costs 0 flops and has two byte figures (docs/conventions.md). ``S`` is the
collective's size as NCCL-tests defines it, ``n`` the size of the process group the call was
made on (the engine passes it as ``group_size``) and ``r`` this rank in it (``group_rank``):

* ``comm_alg_bytes`` is ``S``: NCCL-tests' algbw is ``S / time``; torch.profiler shows the
  buffers ``S`` is made of;
* ``comm_bytes`` is what this rank puts on the wire. For the symmetric collectives it is the
  bus convention, ``S`` times NCCL-tests' bus factor (``comm_bytes / time`` is its busbw);
  for uneven all-to-alls and rooted collectives, what this rank really sends, by its role
  (NCCL's ring and chain algorithms, ranks in group order):

    collective              S                                   comm_bytes of rank r
    all_reduce              the tensor                          S * 2(n - 1) / n
    all_gather              the gathered output                 S * (n - 1) / n
    reduce_scatter          the unscattered input               S * (n - 1) / n
    all_to_all              everything r sends, own chunk too   S minus r's own chunk
                                                                (S * (n - 1) / n when even)
    broadcast               the tensor                          S, but 0 on the chain's last
                                                                rank (root - 1) mod n
    reduce                  the tensor                          S, but 0 on the root
    gather                  the gathered whole (n chunks)       r's chunk, 0 on the root
    scatter                 the scattered whole (n chunks)      S * (n - 1) / n on the root,
                                                                0 elsewhere
    send, recv              the message                         send S, recv 0
    barrier, wait_tensor    0                                   0

rounded down to whole bytes. ``bytes_read`` / ``bytes_written`` are the local memory the call
touches: what it sends is read, what it receives is written (an in-place all-reduce reads and
writes its tensors; an all-gather reads its input and writes the gathered output). FSDP2's
``fsdp::all_gather_copy_in``, ``split_with_sizes_copy``, ``chunk_cat`` and ``copy_`` do no
arithmetic: local copies into and out of the flat all-gather / reduce-scatter buffers.
"""

from __future__ import annotations

import functools
import math

import torch

from ._registry import REGISTRY, Cost, Movement


class _Namespace:
    """``torch.ops.<namespace>``'s packets, or the op's qualified name for one not registered
    yet (some appear when ``torch.distributed`` modules are imported)."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, op: str):
        try:
            return getattr(getattr(torch.ops, self.name), op)
        except AttributeError:
            return f"{self.name}::{op}"


c10d = _Namespace("c10d")
functional = _Namespace("_c10d_functional")
functional_autograd = _Namespace("_c10d_functional_autograd")
dtensor = _Namespace("_dtensor")


# names of ops not registered yet wait for them (lazy): torch.distributed's modules define them
_collective = functools.partial(REGISTRY.collective, lazy=True)


def _nbytes(shape, dtype) -> int:
    """Dense bytes of one shape, a list of shapes, or a list of lists (``dtype``: the
    tensor's, or one per element of a list)."""
    if isinstance(shape, (list, tuple)) and not isinstance(shape, torch.Size):
        dtypes = dtype if isinstance(dtype, list) else [dtype] * len(shape)
        return sum(_nbytes(s, d if d is not None else _first(dtype)) for s, d in
                   zip(shape, dtypes))
    return math.prod(shape) * dtype.itemsize


def _first(dtype):
    """A dtype from ``dtype`` or the first one of a (nested) list of them."""
    while isinstance(dtype, list):
        dtype = next((d for d in dtype if d is not None), None)
    return dtype


def all_reduce_bytes(size: int, n: int) -> int:
    """Ring all-reduce: a reduce-scatter then an all-gather, each (n - 1)/n of the buffer."""
    return size * 2 * (n - 1) // n


def gather_bytes(size: int, n: int) -> int:
    """Ring all-gather / reduce-scatter / all-to-all: every chunk but the rank's own."""
    return size * (n - 1) // n


def _cost(comm: int, read: int, written: int, alg: int) -> Cost:
    return Cost(0, 0, bytes_read=read, bytes_written=written, comm_bytes=comm,
                comm_alg_bytes=alg)


# -- all-reduce -----------------------------------------------------------------------------
@_collective([c10d.allreduce_, c10d.allreduce_coalesced_, functional.all_reduce,
                      functional.all_reduce_, functional.all_reduce_coalesced,
                      functional.all_reduce_coalesced_])
def all_reduce(tensors, *rest, out_shape, dtypes, group_size):
    # tensors: the buffer (or list of buffers) reduced in place or into a new one
    size = _nbytes(tensors, dtypes[0])
    return _cost(all_reduce_bytes(size, group_size), size, size, size)


# -- all-gather -----------------------------------------------------------------------------
@_collective(c10d._allgather_base_)
def allgather_base(output, input, *rest, out_shape, dtypes, group_size):
    size = _nbytes(output, dtypes[0])  # output: [n * rows, ...], the gathered buffer
    return _cost(gather_bytes(size, group_size), _nbytes(input, dtypes[1]), size, size)


@_collective([c10d.allgather_, c10d.allgather_coalesced_,
                      c10d.allgather_into_tensor_coalesced_])
def allgather_lists(outputs, inputs, *rest, out_shape, dtypes, group_size):
    # outputs: a list of n tensors per input (a list of lists), or one gathered tensor per
    # input (into_tensor_coalesced); the gathered tensors have the inputs' dtypes
    dtype = _first(dtypes[1])
    size = _nbytes(outputs, dtype)
    return _cost(gather_bytes(size, group_size), _nbytes(inputs, dtypes[1]), size, size)


@_collective([functional.all_gather_into_tensor, functional.all_gather_into_tensor_out,
                      functional.all_gather_into_tensor_coalesced,
                      functional_autograd.all_gather_into_tensor])
def all_gather_into_tensor(input, *rest, out_shape, dtypes, group_size):
    sent = _nbytes(input, dtypes[0])
    size = sent * group_size  # the gathered output
    return _cost(gather_bytes(size, group_size), sent, size, size)


# -- reduce-scatter -------------------------------------------------------------------------
@_collective(c10d._reduce_scatter_base_)
def reduce_scatter_base(output, input, *rest, out_shape, dtypes, group_size):
    size = _nbytes(input, dtypes[1])  # input: the unscattered buffer
    return _cost(gather_bytes(size, group_size), size, _nbytes(output, dtypes[0]), size)


@_collective([c10d.reduce_scatter_, c10d.reduce_scatter_tensor_coalesced_])
def reduce_scatter_lists(outputs, inputs, *rest, out_shape, dtypes, group_size):
    dtype = _first(dtypes[0])
    size = _nbytes(inputs, dtype)
    return _cost(gather_bytes(size, group_size), size, _nbytes(outputs, dtypes[0]), size)


@_collective([functional.reduce_scatter_tensor, functional.reduce_scatter_tensor_out,
                      functional.reduce_scatter_tensor_coalesced,
                      functional_autograd.reduce_scatter_tensor])
def reduce_scatter_tensor(input, *rest, out_shape, dtypes, group_size):
    size = _nbytes(input, dtypes[0])
    return _cost(gather_bytes(size, group_size), size, size // group_size, size)


# -- all-to-all -----------------------------------------------------------------------------
def _own_chunk(shape, dtype, splits, n: int, r: int) -> int:
    """Bytes of rank ``r``'s own chunk of a buffer of ``shape`` split along dim 0 into
    ``splits`` rows (an empty ``splits``: ``n`` even chunks)."""
    size = _nbytes(shape, dtype)
    if not splits:
        return size // n
    if len(splits) != n or r >= n:
        raise ValueError(f"an all-to-all over {n} ranks got {len(splits)} split sizes "
                         f"{list(splits)} (rank {r})")
    return splits[r] * (size // shape[0] if shape[0] else 0)


@_collective(c10d.alltoall_)
def alltoall(outputs, inputs, *rest, out_shape, dtypes, group_size, group_rank):
    # inputs: one tensor per rank (its own at group_rank, which never leaves)
    size = _nbytes(inputs, dtypes[1])  # everything this rank sends, its own chunk included
    own = _nbytes(inputs[group_rank], _first(dtypes[1])) if group_rank < len(inputs) else 0
    return _cost(size - own, size, _nbytes(outputs, dtypes[0]), size)


@_collective(c10d.alltoall_base_)
def alltoall_base(output, input, process_group, output_split_sizes, input_split_sizes, *rest,
                  out_shape, dtypes, group_size, group_rank):
    size = _nbytes(input, dtypes[1])
    own = _own_chunk(input, dtypes[1], input_split_sizes, group_size, group_rank)
    return _cost(size - own, size, _nbytes(output, dtypes[0]), size)


@_collective([functional.all_to_all_single, functional_autograd.all_to_all_single])
def all_to_all_single(input, output_split_sizes, input_split_sizes, *rest, out_shape, dtypes,
                      group_size, group_rank):
    size = _nbytes(input, dtypes[0])
    own = _own_chunk(input, dtypes[0], input_split_sizes, group_size, group_rank)
    return _cost(size - own, size, math.prod(out_shape) * dtypes[0].itemsize, size)


@_collective(dtensor.shard_dim_alltoall)
def shard_dim_alltoall(input, *rest, out_shape, dtypes, group_size):
    size = _nbytes(input, dtypes[0])  # split evenly across the group
    return _cost(gather_bytes(size, group_size), size,
                 math.prod(out_shape) * dtypes[0].itemsize, size)


# -- one to all, all to one (root_rank: the root's rank in the group) -----------------------
@_collective(c10d.broadcast_)
def broadcast(tensors, process_group, root_rank, *rest, out_shape, dtypes, group_size,
              group_rank):
    size = _nbytes(tensors, dtypes[0])
    return _cost(_chain_bytes(size, group_size, group_rank, root_rank), size, size, size)


@_collective([functional.broadcast, functional.broadcast_])
def functional_broadcast(input, src, *rest, out_shape, dtypes, group_size, group_rank):
    size = _nbytes(input, dtypes[0])
    return _cost(_chain_bytes(size, group_size, group_rank, src), size, size, size)


def _chain_bytes(size: int, n: int, r: int, root: int) -> int:
    """A broadcast pipelined along the chain root, root + 1, ...: every rank forwards the
    buffer but the last, (root - 1) mod n."""
    return 0 if n <= 1 or r == (root - 1) % n else size


@_collective(c10d.reduce_)
def reduce(tensors, process_group, reduce_op, root_rank, *rest, out_shape, dtypes,
           group_size, group_rank):
    # pipelined along the chain that ends at the root: every rank sends the buffer but it
    size = _nbytes(tensors, dtypes[0])
    return _cost(0 if group_rank == root_rank else size, size, size, size)


@_collective(c10d.gather_)
def gather(outputs, inputs, process_group, root_rank, *rest, out_shape, dtypes, group_size,
           group_rank):
    sent = _nbytes(inputs, dtypes[1])
    received = _nbytes(outputs, _first(dtypes[1]))  # the root's list; empty elsewhere
    comm = 0 if group_rank == root_rank else sent  # the root's own chunk stays
    return _cost(comm, sent, received, sent * group_size)


@_collective(c10d.scatter_)
def scatter(outputs, inputs, process_group, root_rank, *rest, out_shape, dtypes, group_size,
            group_rank):
    received = _nbytes(outputs, dtypes[0])
    sent = _nbytes(inputs, _first(dtypes[0]))  # the root's list; empty elsewhere
    comm = gather_bytes(sent, group_size) if group_rank == root_rank else 0
    return _cost(comm, sent, received, received * group_size)


# -- point to point, barriers, waits --------------------------------------------------------
@_collective([c10d.send, functional.isend])
def send(tensors, *rest, out_shape, dtypes):
    size = _nbytes(tensors, dtypes[0])
    return _cost(size, size, 0, size)


@_collective([c10d.recv_, c10d.recv_any_source_, functional.irecv])
def recv(tensors, *rest, out_shape, dtypes):
    size = _nbytes(tensors, dtypes[0])
    return _cost(0, 0, size, size)


@_collective(functional.batch_p2p_ops)
def batch_p2p_ops(op_list, peer_list, tag_list, tensors, *rest, out_shape, dtypes):
    sent = sum(_nbytes(t, d) for op, t, d in zip(op_list, tensors, dtypes[3]) if op == "isend")
    received = sum(_nbytes(t, d) for op, t, d in zip(op_list, tensors, dtypes[3])
                   if op != "isend")
    # S: the message each way (NCCL-tests' sendrecv: the bytes sent, as many received)
    return _cost(sent, sent, received, max(sent, received))


@_collective([c10d.barrier, c10d.monitored_barrier_, functional.wait_tensor])
def synchronise(*args, out_shape):
    # waits for the others (or, wait_tensor, for an async collective's result): no bytes
    return _cost(0, 0, 0, 0)


@REGISTRY.formula(c10d.check_for_nan, lazy=True)
def check_for_nan(tensor, *rest, out_shape):
    return Cost(math.prod(tensor), 0, bytes_written=0)  # one test per element


REGISTRY.no_arithmetic([functional._wrap_tensor_autograd, dtensor.mesh_get_process_group],
                       Movement.NONE, lazy=True)


# -- FSDP2's copy-in / copy-out (registered when torch.distributed.fsdp is imported) --------
def _all_gather_copy_in(inputs, output, *rest, out_shape, dtypes):
    # copies this rank's shards into its slice of the flat all-gather buffer
    size = _nbytes(inputs, dtypes[0])
    return Cost(0, 0, bytes_read=size, bytes_written=size)


def _split_with_sizes_copy(output, split_sizes, *rest, out_shape, dtypes, **kwargs):
    # copies the gathered flat buffer out into the unsharded parameters (out=, same dtype)
    size = _nbytes(output, dtypes[0])
    return Cost(0, 0, bytes_read=size, bytes_written=size)


def _chunk_cat(tensors, *rest, out_shape, dtypes, **kwargs):
    # copies the gradients into the flat reduce-scatter input (padding to n chunks)
    size = _nbytes(tensors, dtypes[0])
    return Cost(0, 0, bytes_read=size, bytes_written=size)


def _fsdp_copy(tensor, data, *rest, out_shape, dtypes):
    return Cost(0, 0, bytes_read=_nbytes(data, dtypes[1]), bytes_written=_nbytes(tensor, dtypes[0]))


fsdp = _Namespace("fsdp")
for _op, _formula in ((fsdp.all_gather_copy_in, _all_gather_copy_in),
                      (fsdp.split_with_sizes_copy, _split_with_sizes_copy),
                      (fsdp.chunk_cat, _chunk_cat), (fsdp.copy_, _fsdp_copy)):
    REGISTRY.no_arithmetic(_op, Movement.COPY, bytes=_formula, lazy=True)
