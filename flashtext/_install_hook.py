"""Install the start-up hook: a .pth file that imports :mod:`flashtext._boot` in every Python
process of this environment, so TRITON_INTERPRET is decided before any import of triton.

Run by ``make`` as ``python -m flashtext._install_hook``.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

PTH_NAME = "flashtext_boot.pth"


def install() -> Path:
    target = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    target.write_text("import flashtext._boot\n")
    return target


if __name__ == "__main__":
    print(f"installed {install()}")
