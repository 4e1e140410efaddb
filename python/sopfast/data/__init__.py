"""Data: the built-in offline datasets, your own data from files, and the batch parser."""
