#!/usr/bin/env bash
# make test, as steps: each runs under a bound of its own, and the run ends
# with a table of every step's wall time and whether it began cold or warm.
#
#   hack/test.sh        every step (make test)
#   hack/test.sh e2e    the e2e build and the e2e tests alone (make e2e)
#
# The e2e build (every tool the e2e cluster runs, built into
# ~/.cache/converge-e2e) starts right after deps, beside the other steps at a
# lower priority, so that it takes the CPU they leave idle; the e2e tests
# wait for it. A step that runs past its bound is ended with SIGTERM (its
# whole process group) and the run says which step it was; the e2e test
# binary takes its cluster down on SIGTERM. STEP_SCALE=2 doubles every bound
# (a slower machine).
set -uo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
RUN_DIR=${RUN_DIR:-$PWD/.run}
STORAGE_SUITE=${STORAGE_SUITE-parallel}
STEP_SCALE=${STEP_SCALE:-1}
E2E_BIN=$RUN_DIR/e2e/converge-e2e.test
STEPS=$RUN_DIR/steps
mkdir -p "$STEPS"
rm -f "$STEPS"/*

# The Go build cache's size when the run began: under 200 MB it is cold
# (a warm one holds gigabytes).
gocache=$($GO env GOCACHE)
gocache_mb=$(du -sm "$gocache" 2>/dev/null | cut -f1)
go_start=warm
[ "${gocache_mb:-0}" -lt 200 ] && go_start=cold
run_start=$(date +%s)

# record <step> <seconds> <status> <start>
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >"$STEPS/$(date +%s%N)-$1"; }

table() {
	local total=$(($(date +%s) - run_start))
	echo
	echo "make test: steps (2 cores here: $(nproc) CPUs; Go build cache ${gocache_mb:-0} MB at the start)"
	printf '  %-12s %8s  %-6s %s\n' step "wall" start status
	cat "$STEPS"/* 2>/dev/null | while IFS=$'\t' read -r name secs status start; do
		printf '  %-12s %7ss  %-6s %s\n' "$name" "$secs" "$start" "$status"
	done
	printf '  %-12s %7ss\n' total "$total"
}
# On the way out: the background build, if it still runs, ends; the table.
e2e_build_pid=
finish() {
	[ -n "$e2e_build_pid" ] && kill -TERM -- "-$e2e_build_pid" 2>/dev/null
	table
}
trap finish EXIT

# bound <minutes>: the seconds of a bound of that many minutes, scaled.
bound() { awk -v m="$1" -v s="$STEP_SCALE" 'BEGIN { printf "%d", m * s * 60 }'; }

# step <name> <minutes> <start> <command...>: runs the command under its
# bound, records it, and stops the run when it fails.
step() {
	local name=$1 minutes=$2 start=$3
	shift 3
	local bound
	bound=$(bound "$minutes")
	echo "==> $name (bound $((bound / 60)) min)"
	local t0=$SECONDS rc
	timeout --signal=TERM --kill-after=3m "$bound" "$@"
	rc=$?
	local secs=$((SECONDS - t0))
	if [ $rc -eq 0 ]; then
		record "$name" "$secs" ok "$start"
		return 0
	fi
	if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
		record "$name" "$secs" "RAN PAST ITS $((bound / 60)) MIN" "$start"
		echo "make test: step $name ran past its bound of $((bound / 60)) minutes and was ended; a slower machine can run with STEP_SCALE=2" >&2
	else
		record "$name" "$secs" "failed ($rc)" "$start"
		echo "make test: step $name failed (exit $rc)" >&2
	fi
	cleanup_e2e
	exit 1
}

# cleanup_e2e ends and removes whatever an e2e run that did not take itself
# down left behind (a panic, a SIGKILL): the binary finds it by its run
# directory's name and its owner being gone.
cleanup_e2e() {
	[ -x "$E2E_BIN" ] && "$E2E_BIN" -clean-stale 2>&1 | sed 's/^/  /'
	return 0
}

# The e2e build: every tool the cluster runs, then the e2e test binary; its
# log is printed when it fails, its summary when it ends.
e2e_build() {
	mkdir -p "$(dirname "$E2E_BIN")"
	(cd test/e2e && $GO test -c -o "$E2E_BIN" .) &&
		"$E2E_BIN" -build-only -build-summary="$STEPS.e2e-build"
}

# start_e2e_build runs the e2e build in the background, niced, logging to a
# file; wait_e2e_build waits for it and records it as a step. Its bound is
# timeout's, whose process group the run ends if it stops first.
start_e2e_build() {
	rm -f "$STEPS.e2e-build" "$RUN_DIR/e2e-build.rc"
	e2e_build_t0=$SECONDS
	export -f e2e_build
	export GO E2E_BIN STEPS
	nice -n 10 timeout --signal=TERM --kill-after=1m "$(bound 40)" bash -c e2e_build >"$RUN_DIR/e2e-build.log" 2>&1 &
	e2e_build_pid=$!
	echo "==> e2e build started in the background (log: $RUN_DIR/e2e-build.log)"
}

wait_e2e_build() {
	echo "==> waiting for the e2e build"
	local rc secs start=warm
	wait "$e2e_build_pid"
	rc=$?
	e2e_build_pid=
	secs=$((SECONDS - e2e_build_t0))
	grep -q '^built ' "$STEPS.e2e-build" 2>/dev/null && start=cold
	sed 's/^/  /' "$STEPS.e2e-build" 2>/dev/null
	if [ "$rc" -eq 0 ]; then
		record e2e-build "$secs" ok "$start"
		return 0
	fi
	tail -n 60 "$RUN_DIR/e2e-build.log"
	if [ "$rc" -eq 124 ]; then
		record e2e-build "$secs" "RAN PAST ITS $(($(bound 40) / 60)) MIN" "$start"
		echo "make test: the e2e build ran past its bound and was ended; the log above says what it was building" >&2
	else
		record e2e-build "$secs" "failed ($rc)" "$start"
		echo "make test: the e2e build failed (exit $rc)" >&2
	fi
	exit 1
}

e2e_tests() {
	step e2e-units 10 "$go_start" bash -c "cd test/e2e && $GO test -count=1 ./invariants ./standin ./privilege ./runs"
	mkdir -p "$RUN_DIR"
	# The binary's own timeout is a backstop past the step's bound: the step
	# ends it first, with SIGTERM, and it takes the cluster down.
	step e2e 45 warm bash -c "cd test/e2e && exec '$E2E_BIN' -test.count=1 -test.v -test.timeout=$((60 * STEP_SCALE))m \
		-storage-suite='$STORAGE_SUITE' -storage-report='$RUN_DIR/storage-junit.xml'"
	cleanup_e2e
}

step deps 10 - ./hack/install-deps.sh e2e
if [ "${1:-}" = e2e ]; then
	start_e2e_build
	wait_e2e_build
	e2e_tests
	exit 0
fi
start_e2e_build
step vet 10 "$go_start" make --no-print-directory vet
step go-test 20 "$go_start" $GO test -count=1 -timeout 25m ./...
step compat 5 "$go_start" make --no-print-directory compat
step chart 5 "$go_start" make --no-print-directory chart
step fuzz 5 "$go_start" make --no-print-directory fuzz
wait_e2e_build
e2e_tests
