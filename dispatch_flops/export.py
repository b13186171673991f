"""``dispatch_flops.export``: the public import path of
``dispatch_flops.views.export``.

The name is bound to that module itself (``dispatch_flops.export is
dispatch_flops.views.export``): one object under both paths, patches included.
"""

import sys

from dispatch_flops.views import export

sys.modules[__name__] = export
