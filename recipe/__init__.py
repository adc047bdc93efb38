"""Namespace for verl training recipes."""
