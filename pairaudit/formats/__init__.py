"""Dataset formats: each one object (its rows, prompts, scorer, lm-eval mapping) behind one registry.

Below both ``datasets`` (rows to items, prompts) and ``quality`` (scoring), so
that building a dataset and scoring its answers read one definition of each
format and neither phase imports the other: ``base`` (what a format is),
``registry`` (the table every phase looks a format up in), one module per
format (``gsm8k``, ``math_boxed``, ``mbpp``, ``humaneval``, ``answerformats``
for qa and multiple_choice), ``code`` and ``boxed`` (what several share).
Imports only ``core``; the code formats reach the sandbox through the
scoring context the scorer hands them.
"""
