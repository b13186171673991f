"""The engine room: counting. The dispatch mode (``mode``) prices every aten op into op
records (``records``) of the module frame the tracker (``tracker``) says is running; timing
(``timing``, ``trace``), meta-device runs (``meta``), compiled graphs (``compiled``), saved
activations (``saved``), module facts (``facts``), module outputs (``activations``), MoE
expert load (``experts``) and attention's masked pairs (``attention``) are its parts. It
imports ``results`` (the types it fills) and the formula library, never views."""
