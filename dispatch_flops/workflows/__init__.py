"""Workflows built on ``FlopCounter``: warm repeats and their medians (``repeat.measure``),
``generate()`` cut into prefill and decode steps (``generation``), a run gathered from
every rank (``distributed``), a pipeline stage's transfers and actions told apart
(``pipeline``), and tokens/s and MFU of a training loop timed on steps that are not counted
(``throughput.ThroughputMeter``), a recorded torch.profiler trace priced offline
(``traces.from_trace``), and a lent model given back as it was found (``untouched``: what
``paper_table`` and the peer drop-ins run on)."""
