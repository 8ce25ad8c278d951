#!/usr/bin/env bash
# Runs a command with the machine deliberately loaded: two busy processes per core, as on a shared
# CI machine. Tests must hold here too (they wait for conditions, never for the machine's speed).
#   tests/under_load.sh                        the tests once seen failing under load (below)
#   tests/under_load.sh .venv/bin/pytest -q tests/unit/attach
#   KVSCOPE_LOAD_PER_CORE=3 tests/under_load.sh make check
# The busy processes are killed when the command ends, however it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${KVSCOPE_VENV:-.venv}/bin
PER_CORE=${KVSCOPE_LOAD_PER_CORE:-2}
if [ $# -eq 0 ]; then
  set -- "$BIN/pytest" -q -p no:cacheprovider \
    "tests/e2e/test_stream_dashboard_browser.py::test_stream_dashboard_says_silent_for_a_killed_engine_and_what_to_do_for_a_restarted_one" \
    "tests/integration/test_alerts_vm.py::test_the_live_export_raises_the_draft_alarm_before_the_failure_as_the_file_export_does" \
    "tests/unit/attach/test_stream_feed.py::test_a_real_clock_stream_shows_wall_clock_times_in_status_counters_and_axes" \
    tests/unit/recording/test_completeness.py tests/unit/otel/test_sink.py
fi

busy=()
stop_busy() {
  for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${busy[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop_busy EXIT
trap 'exit 130' INT TERM

n=$(( $(nproc) * PER_CORE ))
for _ in $(seq "$n"); do
  python3 -c 'while True: pass' &
  busy+=("$!")
done
echo "== under load: $n busy processes ($PER_CORE per core): $*" >&2
"$@"
