"""One-step-off (k-step-off) asynchronous PPO/GRPO for verl 0.9.1.

The FSDP2 actor and the rollout replicas live on disjoint resource pools; generation of the
next batches overlaps training of the current one, and weights flow actor -> rollout through
verl's checkpoint-engine manager after every step. See docs/advance/one_step_off_async/index.md.
"""

import os

# In a process of a run (the driver after launch, every Ray worker) verl imports the recipe's plugin while it
# initializes (VERL_USE_EXTERNAL_MODULES), and the plugin imports recipe modules that import verl. Importing
# verl before any recipe module keeps every recipe module out of that cycle, whichever is imported first.
if "recipe.one_step_off_async.verl_plugin" in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(","):
    import verl  # noqa: F401
