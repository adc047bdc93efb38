"""The built-in tiny task of the one-step-off recipe, generated offline from a seed.

``assets.ensure_assets()`` builds (once, into a cache) a tokenizer, a warm-started tiny Qwen2 and the parquet
files of the tasks (``task.py``, ``long_tail.py``, ``tool_task.py``; ``vision_task.py`` with a tiny Qwen2.5-VL of its
own), which ``reward.py`` scores.
"""
