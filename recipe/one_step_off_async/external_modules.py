"""How the recipe's modules reach every process that imports verl: ``VERL_USE_EXTERNAL_MODULES``.

verl imports the comma-separated modules listed in this variable in ``verl/__init__.py``, in the
driver and in every Ray worker. The recipe lists there what must run in each process: the CPU
platform plugin, the policy losses (registered in verl's registry), the one-GPU patch. Each
caller sets the value in ``os.environ`` and in Ray's runtime env (``main_ppo.prepare_config``).
"""

from __future__ import annotations

import os

ENV = "VERL_USE_EXTERNAL_MODULES"


def listing_with(module: str, first: bool = False, also: str = "") -> str:
    """The variable's value with ``module`` added (``first``: ahead of the others, as a platform plugin
    must be), keeping the modules already listed in ``os.environ`` and in ``also``."""
    listed = [m for m in (*os.environ.get(ENV, "").split(","), *also.split(",")) if m and m != module]
    listed = [module, *listed] if first else [*listed, module]
    return ",".join(dict.fromkeys(listed))
