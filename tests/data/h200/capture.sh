#!/usr/bin/env bash
# How the nvidia-smi readings in this folder were captured on an H200 host:
# idle, under a bf16 matmul load near the power limit, and right after it,
# with the exact queries pairaudit's clock facts run (current field names and
# the deprecated ones), plus the cumulative event-reason counters and the
# driver's own field list.  Writes everything under ${OUT:-.}.
set -u
O=${OUT:-.}
Q=clocks.sm,clocks.max.sm,clocks.applications.graphics,clocks_throttle_reasons.active,power.limit
EV=index,uuid,driver_version,clocks.sm,clocks.max.sm,clocks.applications.graphics,clocks.gr,clocks.max.gr,power.limit,power.default_limit,power.max_limit,enforced.power.limit,power.draw,temperature.gpu,clocks_event_reasons.active,clocks_event_reasons.sw_power_cap,clocks_event_reasons.hw_slowdown,clocks_event_reasons.hw_thermal_slowdown,clocks_event_reasons.hw_power_brake_slowdown,clocks_event_reasons.sw_thermal_slowdown,clocks_event_reasons.sync_boost
CNT=index,clocks_event_reasons_counters.sw_power_cap,clocks_event_reasons_counters.sync_boost,clocks_event_reasons_counters.sw_thermal_slowdown,clocks_event_reasons_counters.hw_thermal_slowdown,clocks_event_reasons_counters.hw_power_brake_slowdown
OLD=index,clocks_throttle_reasons.active,clocks_throttle_reasons.sw_power_cap,clocks_throttle_reasons.hw_slowdown,clocks_throttle_reasons.hw_thermal_slowdown,clocks_throttle_reasons.hw_power_brake_slowdown,clocks_throttle_reasons.sw_thermal_slowdown
snap() {  # $1: label
    nvidia-smi --query-gpu=$Q --format=csv,noheader,nounits > "$O/$1.legacy.csv" 2>&1
    nvidia-smi --query-gpu=$EV --format=csv,nounits > "$O/$1.events.csv" 2>&1
    nvidia-smi --query-gpu=$CNT --format=csv,nounits > "$O/$1.counters.csv" 2>&1
    nvidia-smi --query-gpu=$OLD --format=csv,nounits > "$O/$1.throttle-names.csv" 2>&1
    nvidia-smi -q -d PERFORMANCE,CLOCK,POWER > "$O/$1.q.txt" 2>&1
}
nvidia-smi --help-query-gpu > "$O/help-query-gpu.txt" 2>&1
nvidia-smi --query-gpu=clocks.gpu_locked,clocks.locked_max.sm --format=csv,nounits > "$O/locked-fields.txt" 2>&1
nvidia-smi --query-gpu=no.such.field --format=csv > "$O/bad-field.txt" 2>&1; echo "rc=$?" >> "$O/bad-field.txt"
snap idle
python3 - <<'PY' &
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
t = time.time()
while time.time() - t < 40:
    for _ in range(50):
        a @ a
    torch.cuda.synchronize()
PY
LOAD=$!
sleep 30
snap loaded
wait $LOAD
snap after
