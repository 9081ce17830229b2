"""One module per operation. Importing this package registers every module found here, so a
chapter adds a kernel family by adding a file: nothing else needs editing."""
import importlib
import pkgutil

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")
