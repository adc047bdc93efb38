"""Where verl runs: the CPU platform plugin (``cpu``), the tiny patches of verl the recipe needs
(``verl_patches``), and both pools on one GPU (``one_gpu``). Each says what it changes; the recipe's verl
plugin (``verl_plugin.py``) applies the selected ones in every process that imports verl."""
