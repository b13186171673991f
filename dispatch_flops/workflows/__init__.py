"""Workflows built on ``FlopCounter``: warm repeats and their medians (``repeat.measure``),
``generate()`` cut into prefill and decode steps (``generation``), a run gathered from
every rank (``distributed``), and a pipeline stage's transfers and actions told apart
(``pipeline``)."""
