"""The results room: a finished run as data. ``Profile`` (``profile``) holds rows (``rows``) and
facts (``facts``); every view is ``ProfileViews`` (``queries``), computed by ``aggregate`` and
``utilisation`` (rooflines, MFU) against ``roofline``'s device peaks (measured ones:
``calibration``); ``combine`` merges runs, ``schema`` reads and writes them,
``validate`` bounds what enters one (from a file, a rank, a formula's ``Cost``).
It imports nothing of the engine or the views: its text and files go through ``present``."""
