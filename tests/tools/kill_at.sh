# shellcheck shell=bash
# Sourced by the crash tests (train_faults.sh, data_prepare_faults.sh): kill -9 at a named
# moment, proven. The caller defines fail(). Works under `set -e` and without it.

# The state letter of process $1 (R, S, Z, ...), or nothing when there is no such process.
proc_state() {
  local stat
  read -r stat 2> /dev/null < "/proc/$1/stat" || return 0
  stat=${stat##*) }
  echo "${stat%% *}"
}

# kill_at POINT[:N] LOG -- COMMAND...
#   Runs COMMAND in the background with the test pause hook (include/s3r/core/test_pause.hpp)
#   armed at the Nth arrival at POINT, output to LOG; waits up to 120 s for the process to report
#   that it paused there; checks that the report names this process, POINT and N and that the
#   process is still running (not a zombie); kills it with SIGKILL and checks that SIGKILL is
#   what ended it (wait status 137). Fails when the process exits or times out first. Sets
#   killed_pid to the killed process's pid.
kill_at() {
  local at=$1 log=$2; shift 3
  local point=${at%%:*} n=1
  [ "$point" = "$at" ] || n=${at#*:}
  local marker="$log.paused"
  rm -f "$marker"
  S3R_TEST_PAUSE_AT=$at S3R_TEST_PAUSE_FILE=$marker "$@" > "$log" 2>&1 &
  local pid=$! polls=0
  until [ -s "$marker" ]; do
    if [ "$(proc_state "$pid")" = Z ] || ! kill -0 "$pid" 2> /dev/null; then
      local rc=0
      wait "$pid" || rc=$?
      fail "the process exited (status $rc) before it reached $at: $*"$'\n'"$(tail -5 "$log")"
    fi
    if [ "$polls" -ge 6000 ]; then  # 120 s
      kill -9 "$pid" 2> /dev/null || true
      wait "$pid" 2> /dev/null || true
      fail "the process did not reach $at within 120 s: $*"$'\n'"$(tail -5 "$log")"
    fi
    sleep 0.02
    polls=$((polls + 1))
  done
  local got state rc=0
  got=$(cat "$marker")
  [ "$got" = "$pid $point $n" ] || fail "the pause report is '$got', expected '$pid $point $n'"
  state=$(proc_state "$pid")
  if [ -z "$state" ] || [ "$state" = Z ]; then
    fail "the process paused at $at is not running (state '$state')"
  fi
  kill -9 "$pid"
  { wait "$pid" || rc=$?; } 2> /dev/null  # (without bash's "Killed" notice)
  [ "$rc" = 137 ] || fail "the process paused at $at ended with status $rc, not by SIGKILL (137)"
  # shellcheck disable=SC2034  # (read by the caller)
  killed_pid=$pid
}
