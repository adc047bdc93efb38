"""The built-in tiny task of the one-step-off recipe, generated offline from a seed.

``assets.ensure_assets()`` builds (once, into a cache) a byte-level ChatML tokenizer (``tokenizer.py``),
a tiny Qwen2 (``model.py``) warm-started by SFT (``warm_start.py``), and the parquet files of the tasks:
letter sorting (``task.py``), long-tail lengths (``long_tail.py``), tool use (``tool_task.py``);
``reward.py`` scores them all for ``reward.custom_reward_function``; ``evaluate.py`` measures accuracy.
"""
