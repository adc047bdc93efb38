"""The ``hf`` rollout replica (``actor_rollout_ref.rollout.name=hf``): a continuous-batching HF-transformers
engine (``engine``), the server actor verl's agent loops and weight syncs talk to (``server``), and the
replica verl places on the rollout pool (``replica``)."""

from recipe.one_step_off_async.backends import HF

# The name verl's registry serves the replica under (verl_plugin registers it), from the recipe's backend table.
ROLLOUT_NAME = HF
