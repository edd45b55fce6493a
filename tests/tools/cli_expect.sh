#!/usr/bin/env bash
# cli_expect.sh EXPECTED_RC REGEX -- COMMAND...: runs COMMAND, checks its exit status and that its
# combined output matches REGEX (extended grep). Used by ctest for the `s3r` tool's behaviour.
set -u
expected_rc=$1; regex=$2; shift 3
out=$("$@" 2>&1); rc=$?
if [ "$rc" != "$expected_rc" ]; then
  echo "FAIL: exit status $rc, expected $expected_rc: $*"; echo "$out"; exit 1
fi
if ! grep -Eq -- "$regex" <<<"$out"; then
  echo "FAIL: output does not match /$regex/: $*"; echo "$out"; exit 1
fi
echo "ok: $*"
