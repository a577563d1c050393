# tests/cli_checks.sh: the checks the command-line tests share, sourced by them:
#   ok NAME / fail NAME           count a check (passed / failed) and print it
#   expect_fail NAME MESSAGE CMD  CMD must exit 2 with MESSAGE on stderr
#   finish                        print the counts; the status is 0 only without a failure
passed=0
failed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }

expect_fail() {  # NAME MESSAGE CMD...
  local name=$1 message=$2
  shift 2
  "$@" >stdout.txt 2>stderr.txt
  local code=$?
  if [[ $code -ne 2 ]]; then fail "$name: exit code $code, want 2"; cat stderr.txt; return; fi
  if ! grep -qF -- "$message" stderr.txt; then
    fail "$name: stderr lacks '$message'"; cat stderr.txt; return
  fi
  ok "$name"
}

finish() {
  echo "$passed passed, $failed failed"
  [[ $failed -eq 0 ]]
}
