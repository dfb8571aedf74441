"""Exit codes of the ``pairaudit`` command, one table for every subcommand (docs/interop.md)."""

# verdict: the decision; pair: quality-v1's verdict. INCONCLUSIVE and INVALID share 4: no judgement was possible.
EXIT = {"PROMOTE": 0, "REJECT": 1, "HOLD": 3, "INCONCLUSIVE": 4,
        "PASS": 0, "FAIL": 1, "INVALID": 4}
REFUSED = 2  # an input missing, unreadable or refused (its content hash does not match), or bad arguments
OK = 0
