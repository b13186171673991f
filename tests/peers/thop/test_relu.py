# Vendored from Lyken17/pytorch-OpCounter@43c064afb71383501e41eaef9e8c8407265cf77f tests/test_relu.py (thop 0.1.1, MIT, see LICENSE);
# changed: the thop import now names dispatch_flops.compat.thop.
import pytest
import torch
import torch.nn as nn
from dispatch_flops.compat.thop import profile


class TestUtils:
    def test_relu(self):
        n, in_c, out_c = 1, 100, 200
        data = torch.randn(n, in_c)
        net = nn.ReLU()
        flops, params = profile(net, inputs=(torch.randn(n, in_c), ))
        print(flops, params)
        assert flops == 0

    
