"""The ``hf`` rollout replica (``actor_rollout_ref.rollout.name=hf``): a continuous-batching HF-transformers
engine (``engine``), the server actor verl's agent loops and weight syncs talk to (``server``), and the
replica verl places on the rollout pool (``replica``)."""

ROLLOUT_NAME = "hf"
