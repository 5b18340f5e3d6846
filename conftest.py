"""pytest's scheduling across xdist workers (``make test`` runs ``--dist loadgroup``): the cells
of one notebook run in order on one worker (nbval runs a chapter as one kernel session), while
every other test is handed out on its own, so no single long test module holds a worker."""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = str(getattr(item, "path", item.fspath))
        if path.endswith(".ipynb"):
            item.add_marker(pytest.mark.xdist_group(name=path))
