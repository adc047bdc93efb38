"""Hydra configs of the recipe: the GPU default and the CPU profile."""
