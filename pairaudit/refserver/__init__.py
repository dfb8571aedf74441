"""The embedded vLLM-compatible reference server (``python -m pairaudit.refserver``)."""
