"""Dataset preparation for the recipe's GPU launch scripts."""
