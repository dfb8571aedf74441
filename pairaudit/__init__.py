"""pairaudit: paired control/candidate promotion audits for OpenAI-compatible LLM servers."""

__version__ = "0.1.0"
