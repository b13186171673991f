"""``dispatch_flops.plot``: the public import path of
``dispatch_flops.views.plot``.

The name is bound to that module itself (``dispatch_flops.plot is
dispatch_flops.views.plot``): one object under both paths, patches included.
"""

import sys

from dispatch_flops.views import plot

sys.modules[__name__] = plot
