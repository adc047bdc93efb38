"""Weight-sync backends registered with verl's ``CheckpointEngineRegistry``: ``gloo`` (a broadcast group on
CPU), ``checkpoint`` (safetensors through a shared folder, ``files``), verl's manager with each phase of a
sync timed (``timing``), and what the engines share (``common``). Selected by
``actor_rollout_ref.rollout.checkpoint_engine.backend``; the backends never import each other.
"""
