"""Answer formats that a dataset is built with and its answers are scored by.

Below both ``datasets`` (rows to items, prompts) and ``quality`` (scoring), so
that building a dataset and scoring its answers read one definition of each
format and neither phase imports the other. Pure functions; no project imports.
"""
