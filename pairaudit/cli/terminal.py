"""The workflow's terminal: one line per job instead of Snakemake's rule blocks.

Snakemake prints every job as a block (rule, input, output, log, jobid,
wildcards, resources) and every finished job as two lines more; a default
audit's 25 jobs are screens of them between the phases' own progress lines
(items done of total, rate, ETA). This handler, installed as Snakemake's
logger plugin ``pairaudit`` (``logger: [pairaudit]`` in profiles/default),
prints a job's start as one line (what runs, for which arm or dataset, its
log) and its end as one line, and passes everything else through Snakemake's
own formatter and colours: errors with their logs, warnings, the progress
count. A dry run (``-n``) keeps the blocks: it is a plan to read, with no
progress lines between them. ``--verbose`` (or leaving the plugin out of the
profile) brings them back for a real run too.

A plugin, not ``message:`` on every rule: a rule's message replaces its block
even under ``--verbose``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Mapping

from snakemake.logging import ColorizingTextHandler, DefaultFormatter, timestamp
from snakemake_interface_logger_plugins.base import LogHandlerBase
from snakemake_interface_logger_plugins.common import LogEvent


def job_label(rule: str, wildcards: Mapping[str, Any] | None) -> str:
    """``answers (arm=control)``: the rule and the wildcards that say which one."""
    wc = ", ".join(f"{k}={v}" for k, v in (wildcards or {}).items())
    return f"{rule} ({wc})" if wc else rule


class BlockFormatter(DefaultFormatter):
    """Snakemake's formatter, less the "Shell command: None" line of every script rule."""

    def format_shellcmd(self, msg: dict[str, Any]) -> str:
        # a script rule has no shell command; Snakemake would print "Shell command: None"
        if "shellcmd" in msg and not msg["shellcmd"]:
            return ""
        return super().format_shellcmd(msg)


class CompactFormatter(BlockFormatter):
    """A job's start and end on one line each."""

    # the scheduler's own chatter between jobs; each job's line says what started
    SCHEDULER = ("Select jobs to execute...",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.jobs: dict[int, str] = {}

    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, "event", None) == LogEvent.JOB_STARTED or record.msg in self.SCHEDULER:
            return ""  # "Execute 2 jobs...", "Select jobs to execute..."
        return super().format(record)

    def format_job_info(self, msg: dict[str, Any]) -> str:
        label = job_label(msg["rule_name"], msg.get("wildcards"))
        self.jobs[msg["jobid"]] = label
        logs = msg.get("log") or []
        where = f"; log {', '.join(logs)}" if logs else ""
        return f"{timestamp()} started {label}{where}"

    def format_job_finished(self, msg: dict[str, Any]) -> str:
        label = self.jobs.get(msg["job_id"]) if "job_id" in msg else None
        return f"{timestamp()} finished {label}" if label else super().format_job_finished(msg)


class LogHandler(LogHandlerBase, ColorizingTextHandler):
    """Snakemake's own stream handler with the compact formatter (the full one under --verbose)."""

    def __post_init__(self) -> None:
        s = self.common_settings
        ColorizingTextHandler.__init__(self, nocolor=s.nocolor, stream=sys.stdout if s.stdout else sys.stderr)
        # A dry run is a plan to read, with nothing interleaved: it keeps the full blocks.
        self.compact = not (s.verbose or s.dryrun)
        self.setFormatter((CompactFormatter if self.compact else BlockFormatter)(s.quiet, s.show_failed_logs))

    def emit(self, record: logging.LogRecord) -> None:
        if self.compact and getattr(record, "event", None) == LogEvent.JOB_INFO:
            self.last_msg_was_job_info = True  # no blank line before a one-line job
        ColorizingTextHandler.emit(self, record)

    @property
    def writes_to_stream(self) -> bool:
        return True

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return False  # Snakemake's own filter: --quiet, --printshellcmds and the rest still apply

    @property
    def has_formatter(self) -> bool:
        return True

    @property
    def needs_rulegraph(self) -> bool:
        return False
