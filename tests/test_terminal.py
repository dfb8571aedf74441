"""The workflow's terminal (pairaudit/cli/terminal.py): one line per job, Snakemake's blocks where they serve."""

import io
import logging
import subprocess
import sys
from pathlib import Path

from snakemake_interface_logger_plugins.common import LogEvent

from pairaudit.cli import terminal

REPO = Path(__file__).resolve().parents[1]


def record(event, msg="", **extra) -> logging.LogRecord:
    r = logging.LogRecord("snakemake", logging.INFO, __file__, 0, msg, None, None)
    r.__dict__.update(event=event, **extra)
    return r


def job_info(jobid=5, rule="answers", wildcards=None, log=("results/a/logs/answers/control.log",)):
    return record(LogEvent.JOB_INFO, f" Rule: {rule}, Jobid: {jobid}", jobid=jobid, rule_msg=None, rule_name=rule,
                  local=True, input=[], output=["results/a/answers/control.json"], log=list(log), benchmark=None,
                  wildcards=wildcards if wildcards is not None else {"arm": "control"}, reason="Missing output files",
                  resources={"tmpdir": "/tmp"}, priority=0, threads=1, indent=False, is_checkpoint=False,
                  printshellcmd=True, is_handover=False, shellcmd=None)


def job_error(jobid=5):
    return record(LogEvent.JOB_ERROR, "error", jobid=jobid, rule_name="answers", rule_msg=None, input=[],
                  output=["results/a/answers/control.json"], log=[], conda_env=None, shellcmd=None, aux={})


def test_a_job_is_one_line_when_it_starts_and_one_when_it_ends():
    f = terminal.CompactFormatter()
    start = f.format(job_info())
    assert "\n" not in start
    assert start.endswith("started answers (arm=control); log results/a/logs/answers/control.log")
    done = f.format(record(LogEvent.JOB_FINISHED, "Finished jobid: 5 (Rule: answers)", job_id=5))
    assert "\n" not in done and done.endswith("finished answers (arm=control)")
    # a job it never saw start (a rerun's bookkeeping) keeps Snakemake's words
    assert "Finished jobid: 9" in f.format(record(LogEvent.JOB_FINISHED, "Finished jobid: 9 (Rule: x)", job_id=9))
    assert f.format(job_info(7, "promotion", {}, ())).endswith("started promotion")


def test_errors_progress_and_shell_commands_keep_snakemakes_words():
    f = terminal.CompactFormatter()
    err = f.format(job_error())
    assert "Error in rule answers:" in err and "jobid: 5" in err and "output: results/a/answers/control.json" in err
    assert f.format(record(LogEvent.PROGRESS, done=3, total=25)) == "3 of 25 steps (12%) done"
    assert f.format(record(LogEvent.SHELLCMD, "Shell command: None", shellcmd=None)) == ""
    assert f.format(record(LogEvent.SHELLCMD, "Shell command: ls", shellcmd="ls", cmd="ls")) == "ls"
    # the scheduler's chatter goes; any other message stays
    assert f.format(record(LogEvent.JOB_STARTED, "Execute 2 jobs...", jobs=[3, 4])) == ""
    assert f.format(record(None, "Select jobs to execute...")) == ""
    assert f.format(record(None, "Building DAG of jobs...")) == "Building DAG of jobs..."


def test_the_block_formatter_is_snakemakes_without_the_none_shell_command():
    f = terminal.BlockFormatter()
    block = f.format(job_info())
    assert "rule answers:" in block and "    output: results/a/answers/control.json" in block
    assert f.format(record(LogEvent.SHELLCMD, "Shell command: None", shellcmd=None)) == ""


class Settings:
    def __init__(self, **kw):
        self.printshellcmds, self.nocolor, self.quiet, self.debug_dag, self.verbose = True, True, set(), False, False
        self.show_failed_logs, self.stdout, self.dryrun = True, False, False
        self.__dict__.update(kw)


def test_the_handler_is_compact_only_for_a_real_run_without_verbose():
    for kw, compact in [({}, True), ({"verbose": True}, False), ({"dryrun": True}, False)]:
        h = terminal.LogHandler(Settings(**kw), None)
        h.stream = io.StringIO()
        h.emit(job_info())
        out = h.stream.getvalue()
        assert ("started answers (arm=control)" in out) is compact, (kw, out)
        assert ("    output: results/a/answers/control.json" in out) is not compact, (kw, out)
        assert h.writes_to_stream and not h.writes_to_file and h.has_formatter and not h.has_filter


def test_snakemake_finds_the_plugin_by_name_from_outside_the_checkout(tmp_path):
    # install.sh puts the shim's folder on the venv's path; an editable install alone would hide it
    probe = ("from snakemake_interface_logger_plugins.registry import LoggerPluginRegistry as R; "
             "p = R().get_plugin('pairaudit'); print(p.log_handler.__module__)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "pairaudit.cli.terminal"
