# Vendored from Lyken17/pytorch-OpCounter@43c064afb71383501e41eaef9e8c8407265cf77f tests/test_matmul.py (thop 0.1.1, MIT, see LICENSE);
# changed: the thop import now names dispatch_flops.compat.thop.
import pytest
import torch
import torch.nn as nn
from dispatch_flops.compat.thop import profile


class TestUtils:
    def test_matmul_case2(self):
        n, in_c, out_c = 1, 100, 200
        net = nn.Linear(in_c, out_c)
        flops, params = profile(net, inputs=(torch.randn(n, in_c), ))
        print(flops, params)
        assert flops == n * in_c * out_c

    def test_matmul_case2(self):
        for i in range(10):
            n, in_c, out_c = torch.randint(1, 500, (3,)).tolist()
            net = nn.Linear(in_c, out_c)
            flops, params = profile(net, inputs=(torch.randn(n, in_c), ))
            print(flops, params)
            assert flops == n * in_c * out_c
    
    def test_conv2d(self):
        n, in_c, out_c = torch.randint(1, 500, (3,)).tolist()
        net = nn.Linear(in_c, out_c)
        flops, params = profile(net, inputs=(torch.randn(n, in_c), ))
        print(flops, params)
        assert flops == n * in_c * out_c
    
