# Vendored from Lyken17/pytorch-OpCounter@43c064afb71383501e41eaef9e8c8407265cf77f tests/test_utils.py (thop 0.1.1, MIT, see LICENSE);
# changed: the thop import now names dispatch_flops.compat.thop.
from dispatch_flops.compat import thop as utils
import pytest


class TestUtils:
    def test_clever_format_returns_formatted_number(self):
        nums = 1
        format = "%.2f"
        clever_nums = utils.clever_format(nums, format)
        assert clever_nums == "1.00B"

    def test_clever_format_returns_formatted_numbers(self):
        nums = [1, 2]
        format = "%.2f"
        clever_nums = utils.clever_format(nums, format)
        assert clever_nums == ("1.00B", "2.00B")
    