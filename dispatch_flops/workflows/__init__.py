"""Workflows built on ``FlopCounter``: warm repeats and their medians (``repeat.measure``),
``generate()`` cut into prefill and decode steps (``generation``), and a run gathered from
every rank (``distributed``)."""
