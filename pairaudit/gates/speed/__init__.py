"""The speed rules, by concept: ``onebracket`` (win2-v1, win2-v2: one OFF/ON/OFF bracket), ``design`` (the
alternating bracket's arms, looks, alpha spending and log scale), ``sequential`` (the sequential rules over
that bracket), ``sweep`` (several candidates against one control: the schedule and each candidate's windows)
and ``simulate`` (synthetic brackets and the error rates a decision reports). This package's namespace is
the union of theirs, so ``gates.speed.X`` names the same object wherever X lives."""

from pairaudit.gates.speed.design import *  # noqa: F401,F403
from pairaudit.gates.speed.design import (_check_cells, _nums, _q, _v3_gain, _v3_start_values,  # noqa: F401
                                          _v3_window_var)
from pairaudit.gates.speed.onebracket import *  # noqa: F401,F403
from pairaudit.gates.speed.onebracket import _v2_metric, _v2_noise, _win2_v2_core, _z  # noqa: F401
from pairaudit.gates.speed.sequential import *  # noqa: F401,F403
from pairaudit.gates.speed.sequential import (GS_MIN_DF, _levels, _quantiles, _v3_noise,  # noqa: F401
                                              _v3_pct, _win2_sequential, _win2_v3_core)
from pairaudit.gates.speed.simulate import *  # noqa: F401,F403
from pairaudit.gates.speed.simulate import _sub_evidence  # noqa: F401
from pairaudit.gates.speed.sweep import *  # noqa: F401,F403
