"""The one number formatter: DeepSpeed's compact style next to the fixed one."""

from dispatch_flops import human
from dispatch_flops.results.format import duration, percent


def test_compact_numbers_print_as_deepspeed_does():
    """compact=True is str(round(x, 2)) under the prefix: DeepSpeed's '75.5 MMACs'."""
    assert human(75_497_472, "MACs", compact=True) == "75.5 MMACs"
    assert human(75_497_472, "MACs") == "75.50 MMACs"
    assert human(11_174_215_680, "MACs", compact=True) == "11.17 GMACs"
    assert human(109_482_240, compact=True) == "109.48 M"
    assert human(256, compact=True) == "256"
    assert human(0.5, "FLOPS", compact=True) == "0.5 FLOPS"
    assert duration(0.08319, compact=True) == "83.19 ms"
    assert duration(144e-6, compact=True) == "144.0 us"
    assert duration(1.333, compact=True) == "1.33 s"
    assert percent(1, 3) == "33.33%" and percent(1, 0) == "-" and percent(1, None) == "-"
