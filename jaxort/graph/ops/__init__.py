"""Op handlers, one module per family; every module here is imported on first use.

Adding an op is one decorated function in one of these modules (see
``jaxort.graph.register``); no import list needs editing.
"""

import importlib
import pkgutil

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")
