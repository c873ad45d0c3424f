#!/usr/bin/env bash
# make test, as steps: each runs under a bound of its own, and the run ends
# with a table of every step's start, wall time, and whether it began cold
# or warm.
#
#   hack/test.sh        every step (make test)
#   hack/test.sh e2e    the e2e build and the e2e tests alone (make e2e)
#
# Two lanes run side by side after deps, since most of each one's time is
# spent waiting (on pods, mkfs, fsync, probes), not on the two cores:
#   - the Go lane: vet, the unit and integration tests (go test ./...),
#     compat, chart and fuzz, its output in $RUN_DIR/go-lane.log, printed
#     when it ends;
#   - the e2e lane: the e2e build (every tool the cluster runs, built into
#     ~/.cache/converge-e2e, or found there), then the e2e tests, whose
#     output streams.
# A step that runs past its bound is ended with SIGTERM (its whole process
# group) and the run says which step it was; the e2e test binary takes its
# cluster down on SIGTERM, and whatever a run leaves (a panic, a SIGKILL)
# is cleaned after it. No bound reaches past RUN_BOUND minutes from the
# start (85: CI ends a run at 90), so that the run, not CI, says which step
# ran long. STEP_SCALE=2 doubles every bound (a slower machine); each
# test binary's own timeout lies past its step's bound.
set -uo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
RUN_DIR=$(realpath -m "${RUN_DIR:-$PWD/.run}")
STORAGE_SUITE=${STORAGE_SUITE-parallel}
# The short soak's length and seeds, whose plans it runs at once: full,
# the seed whose plan of 2 minutes holds every kind of event (test/e2e/
# soak's FullSeed), and 0, a random seed, which it prints. SOAK_FOR=0
# skips it.
SOAK_FOR=${SOAK_FOR:-2m}
SOAK_SEED=${SOAK_SEED:-full+0}
STEP_SCALE=${STEP_SCALE:-1}
RUN_BOUND=${RUN_BOUND:-85}
for n in "$STEP_SCALE" "$RUN_BOUND"; do
	[[ $n =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "hack/test.sh: STEP_SCALE and RUN_BOUND are numbers, not '$n'" >&2; exit 2; }
done
E2E_BIN=$RUN_DIR/e2e/converge-e2e.test
# The Makefile's variables reach this script in its environment; the
# commands of the steps must not inherit them (make run, which the quick
# start test runs in a copy of the repository, would serve in this one's).
export -n RUN_DIR STORAGE_SUITE STEP_SCALE RUN_BOUND SOAK_FOR SOAK_SEED
unset MAKEFLAGS MFLAGS MAKELEVEL
STEPS=$RUN_DIR/steps
mkdir -p "$STEPS"
rm -f "$STEPS"/* "$STEPS".* "$RUN_DIR/e2e.log" "$RUN_DIR/go-lane.log"

# The Go build cache's size when the run began: under 200 MB it is cold
# (a warm one holds gigabytes).
gocache_mb=$(du -sm "$($GO env GOCACHE)" 2>/dev/null | cut -f1)
go_start=warm
[ "${gocache_mb:-0}" -lt 200 ] && go_start=cold
run_t0=$SECONDS

# minutes <m>: m minutes, scaled, in seconds.
minutes() { awk -v m="$1" -v s="$STEP_SCALE" 'BEGIN { printf "%d", m * s * 60 }'; }

# record <step> <began at> <seconds> <status> <start>
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >"$STEPS/$(date +%s%N)-$1"; }

table() {
	echo
	echo "hack/test.sh: steps ($(nproc) CPUs; Go build cache ${gocache_mb:-0} MB at the start; 'at': seconds into the run)"
	printf '  %-12s %6s %8s  %-6s %s\n' step at wall start status
	cat "$STEPS"/* 2>/dev/null | sort -t $'\t' -k2,2n | while IFS=$'\t' read -r name at secs status start; do
		printf '  %-12s %6s %7ss  %-6s %s\n' "$name" "$at" "$secs" "$start" "$status"
	done
	printf '  %-12s %6s %7ss\n' total "" "$((SECONDS - run_t0))"
}

# step <name> <minutes> <start> <command...>: runs the command under its
# bound (scaled, and never past RUN_BOUND) and records it; it returns the
# command's failure.
step_pid= step_name= step_t0=
step() {
	local name=$1 start=$3 limit left
	limit=$(minutes "$2")
	shift 3
	left=$((RUN_BOUND * 60 - (SECONDS - run_t0) - 180))
	[ "$left" -lt "$limit" ] && limit=$((left > 60 ? left : 60))
	local t0=$SECONDS at=$((SECONDS - run_t0)) rc secs
	echo "==> $name (bound $((limit / 60)) min)"
	step_name=$name step_t0=$t0 step_at=$at step_start=$start
	# In the background, so that a signal to this shell reaches the wait
	# and stop can end the step's process group (timeout makes one).
	timeout --signal=TERM --kill-after=3m "$limit" "$@" &
	step_pid=$!
	wait "$step_pid"
	rc=$?
	step_pid= step_name=
	secs=$((SECONDS - t0))
	if [ $rc -eq 0 ]; then
		record "$name" "$at" "$secs" ok "$start"
	elif [ $rc -eq 124 ] || { [ $rc -eq 137 ] && [ "$secs" -ge "$limit" ]; }; then
		record "$name" "$at" "$secs" "RAN PAST ITS $((limit / 60)) MIN" "$start"
		echo "hack/test.sh: step $name ran past its bound of $((limit / 60)) minutes and was ended; a slower machine can run with STEP_SCALE=2" >&2
	elif [ $rc -eq 137 ]; then
		record "$name" "$at" "$secs" "killed (SIGKILL)" "$start"
		echo "hack/test.sh: step $name was killed (SIGKILL: the OOM killer?)" >&2
	else
		record "$name" "$at" "$secs" "failed ($rc)" "$start"
		echo "hack/test.sh: step $name failed (exit $rc)" >&2
	fi
	return $rc
}

# stop_step ends the step under way, waits for it, and records it.
stop_step() {
	[ -n "$step_pid" ] || return 0
	kill -TERM -- "-$step_pid" 2>/dev/null
	wait "$step_pid"
	record "$step_name" "$step_at" "$((SECONDS - step_t0))" interrupted "$step_start"
	step_pid=
}

# clean_e2e ends and removes whatever an e2e run that did not take itself
# down left behind (a panic, a SIGKILL): the binary finds it by its run
# directory's name and its owner being gone.
clean_e2e() {
	[ -x "$E2E_BIN" ] && timeout --kill-after=30s 5m "$E2E_BIN" -clean-stale 2>&1 | sed 's/^/  /'
	return 0
}

# e2e_build: the e2e test binary, then every tool the cluster runs; the
# build's summary says of each item whether it was built (cold) or cached.
e2e_build() {
	mkdir -p "$(dirname "$E2E_BIN")"
	(cd test/e2e && $GO test -c -o "$E2E_BIN" .) &&
		"$E2E_BIN" -build-only -build-kubelets-apart -build-timeout="$1s" -build-summary="$STEPS.e2e-build"
}

e2e_lane() {
	export -f e2e_build
	export GO E2E_BIN STEPS
	# The build's own bound a minute past the step's, so that the step's
	# fires first.
	step e2e-build 40 - bash -c "e2e_build $(($(minutes 40) + 60))"
	local rc=$?
	# Cold when the build built anything (its summary says what).
	local label=warm f
	grep -q '^built' "$STEPS.e2e-build" 2>/dev/null && label=cold
	for f in "$STEPS"/*-e2e-build; do
		[ -e "$f" ] && awk -F'\t' -v OFS='\t' -v l="$label" '{ $5 = l; print }' "$f" >"$f.tmp" && mv "$f.tmp" "$f"
	done
	sed 's/^/  /' "$STEPS.e2e-build" 2>/dev/null
	[ $rc -eq 0 ] || return 1
	# The older kubelets build beside e2e-units and the first e2e tests,
	# which need none of them (TestConcurrent waits on pods, not on the
	# CPUs); a test that needs one first waits for this step.
	(
		trap 'stop_step; exit 143' TERM
		step kubelets 30 - "$E2E_BIN" -build-kubelets -build-timeout="$(($(minutes 30) + 60))s"
	) >"$RUN_DIR/kubelets.log" 2>&1 &
	kubelets_pid=$!
	step e2e-units 10 "$go_start" bash -c "make --no-print-directory vet-e2e && cd test/e2e && $GO test -count=1 -timeout $(($(minutes 10) / 60 + 5))m ./invariants ./standin ./privilege ./runs ./ociimage ./dist ./manifests ./peers ./compare ./soak" || {
		kill -TERM "$kubelets_pid" 2>/dev/null
		wait "$kubelets_pid"
		kubelets_pid=
		return 1
	}
	# The binary's own timeout is a backstop past the step's bound: the
	# step ends it first, with SIGTERM, and it takes the cluster down.
	# Its output is kept too, for the digest of failures printed last: a
	# tee that outlives the step's SIGTERM, so that the binary's own
	# take-down still has somewhere to write. TestSoak runs a short soak
	# (issue 71) of two seeds' plans at once: a fixed one, whose plan holds
	# every kind of fault, and a random one, which it prints (make soak
	# SOAK_SEED=116+<it> SOAK_FOR=2m replays the soak), unless SOAK_FOR=0.
	# It took 2351 s in a CI run of this machine kind (39 of the bound's
	# 40 minutes then): the bound leaves room for a slower disk, and ends
	# at most 52 minutes into a warm run.
	step e2e 50 warm bash -c "cd test/e2e && exec '$E2E_BIN' -test.count=1 -test.v -test.parallel=3 -test.timeout=$(($(minutes 50) / 60 + 15))m \
		-storage-suite='$STORAGE_SUITE' -storage-report='$RUN_DIR/storage-junit.xml' \
		-soak='$SOAK_FOR' -soak-seed='$SOAK_SEED' -soak-out='$RUN_DIR/soak' > >(trap '' TERM INT HUP; exec tee '$RUN_DIR/e2e.log') 2>&1"
	rc=$?
	clean_e2e
	wait "$kubelets_pid" || rc=1
	kubelets_pid=
	sed 's/^/  /' "$RUN_DIR/kubelets.log"
	return $rc
}

go_lane() {
	trap 'stop_step; exit 143' TERM
	# vet on a machine with no module cache downloads the modules and
	# compiles client-go and the rest the controller needs, while the e2e
	# lane builds Kubernetes on the same two cores: past 10 minutes on a
	# fresh machine, 1 to 2 warm.
	step vet 20 "$go_start" make --no-print-directory vet-core &&
		step go-test 25 "$go_start" $GO test -count=1 -tags lockorder -timeout $(($(minutes 25) / 60 + 5))m ./... &&
		step compat 5 "$go_start" make --no-print-directory compat TEST_TIMEOUT=$(($(minutes 5) / 60 + 5))m &&
		step chart 5 "$go_start" make --no-print-directory chart TEST_TIMEOUT=$(($(minutes 5) / 60 + 5))m &&
		# The fuzz targets' instrumented builds compete with the e2e lane
		# for the two cores (a run here took 300 s beside the soak's
		# cluster, 21 s alone): the Go lane ends well before the e2e lane,
		# so its bound costs the run nothing.
		step fuzz 12 "$go_start" make --no-print-directory fuzz
}

# On SIGINT, SIGTERM or SIGHUP: the step under way in each lane ends and
# is recorded, what an e2e run left is cleaned, the table is printed.
lane_pid= kubelets_pid=
stop() {
	[ -n "$lane_pid" ] && kill -TERM "$lane_pid" 2>/dev/null
	[ -n "$kubelets_pid" ] && kill -TERM "$kubelets_pid" 2>/dev/null
	stop_step
	wait
	clean_e2e
	exit "$1"
}
trap 'stop 130' INT
trap 'stop 143' TERM
trap 'stop 129' HUP
# failures: after a failed run, what failed and the last it logged, from
# the e2e's and the Go lane's output (hack/failures.awk): the end of the
# output is what a CI excerpt shows.
failures() {
	local logs=() f
	for f in "$RUN_DIR/e2e.log" "$RUN_DIR/go-lane.log"; do
		[ -f "$f" ] && logs+=("$f")
	done
	[ ${#logs[@]} -gt 0 ] && awk -v lines=12 -v most=3 -f hack/failures.awk "${logs[@]}"
}
trap 'rc=$?; table; [ $rc -eq 0 ] || failures' EXIT

step deps 10 - ./hack/install-deps.sh e2e || exit 1
if [ "${1:-}" = e2e ]; then
	e2e_lane
	exit
fi
echo "==> the Go lane runs in the background (log: $RUN_DIR/go-lane.log)"
go_lane >"$RUN_DIR/go-lane.log" 2>&1 &
lane_pid=$!
e2e_lane
e2e_rc=$?
echo "==> waiting for the Go lane"
wait "$lane_pid"
go_rc=$?
lane_pid=
echo "---- the Go lane's output ($RUN_DIR/go-lane.log)"
cat "$RUN_DIR/go-lane.log"
[ $e2e_rc -eq 0 ] && [ $go_rc -eq 0 ]
