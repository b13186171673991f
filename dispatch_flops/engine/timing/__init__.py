"""Timing: what each op and module call took.

``clock``: the ``Timer`` interface (the host clock) and ``CudaTimer`` (CUDA events), and the
relay of nested timed counters; ``kineto``: each op's kernels' time (Kineto/CUPTI), sampled
blocks and their reuse; ``kernels``: the pure join of Kineto's records by correlation id, and
the ``Sampler``; ``trace_file``: a torch.profiler trace file read into the join's records
(both External-id conventions, plain or gzip) and its ops and module calls; ``trace``: the
timeline's timers and events; ``factory``: which timer and runner a counter gets.
"""
