"""Where verl runs: the CPU platform plugin (``cpu``), the two tiny patches of verl it needs
(``verl_patches``), and both pools on one GPU (``one_gpu``). Each module says what it changes and
``apply()``s it only when selected; the recipe's verl plugin (``verl_plugin.py``) applies them in every
process that imports verl."""
