"""Snakemake finds logger plugins by this module name (``--logger pairaudit``); the handler is pairaudit's."""

from pairaudit.cli.terminal import LogHandler

__all__ = ["LogHandler"]
