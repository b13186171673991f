"""``dispatch_flops.distributed``: the public import path of
``dispatch_flops.workflows.distributed``.

The name is bound to that module itself (``dispatch_flops.distributed is
dispatch_flops.workflows.distributed``): one object under both paths, patches included.
"""

import sys

from dispatch_flops.workflows import distributed

sys.modules[__name__] = distributed
