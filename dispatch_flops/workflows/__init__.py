"""Workflows built on ``FlopCounter``: warm repeats and their medians (``repeat.measure``),
``generate()`` cut into prefill and decode steps (``generation``), a run gathered from
every rank (``distributed``), and tokens/s and MFU of a training loop timed on steps that are
not counted (``throughput.ThroughputMeter``)."""
