"""Timing: what each op and module call took.

``clock``: the ``Timer`` interface (the host clock) and ``CudaTimer`` (CUDA events), and the
relay of nested timed counters; ``kineto``: each op's kernels' time (Kineto/CUPTI), sampled
blocks and their reuse; ``kernels``: the pure join of Kineto's records by correlation id, and
the ``Sampler``; ``trace``: the timeline's timers and events; ``factory``: which timer and
runner a counter gets.
"""
