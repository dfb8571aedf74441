"""Interop: pairaudit's evidence in the formats of the tools people already use, and theirs read back.

``lmeval``: lm-eval-harness sample logs and results (export per dataset and
arm; import and pairing of two of lm-eval's own logs). ``vllm_bench``: the
speed bracket's starts as ``vllm bench serve --save-result`` results. The
field mappings and their sources: ``docs/interop.md``.
"""
