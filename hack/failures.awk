# failures.awk: the digest of a failed `go test -v` log that make test
# prints last, where a CI excerpt of the run's tail shows it: each failed
# test that has no failed subtest, with the last lines it logged, and
# what TestMain said after the tests (a broken invariant, a cluster not
# taken down) or a panic. A test's lines are those under its "=== RUN",
# "=== NAME" or "=== CONT" header, as -v prints them, parallel tests
# interleaved; of them the digest shows the first line of each log call
# ("file_test.go:12: ...") and its last, not what lies between (a dump).
#
#   awk -v lines=12 -v most=4 -f hack/failures.awk LOG...
BEGIN {
	if (lines == "") lines = 12
	if (most == "") most = 4
}
FNR == 1 { cur = ""; ended = 0; tail = 0 }
/^=== (RUN|NAME|CONT|PAUSE) / { cur = $3; next }
# Without -v, a failed test's log follows its "--- FAIL:" line.
/^ *--- FAIL: / {
	if (!($3 in failed)) order[++nf] = $3
	failed[$3] = 1
	cur = $3
	next
}
/^ *--- (PASS|SKIP): / { cur = ""; next }
# What TestMain prints after m.Run's verdict is not a test's: the
# invariants, the take-down; nor is a panic.
$0 == "PASS" || $0 == "FAIL" { ended = 1; cur = ""; next }
(ended && /^e2e: /) || /^panic: / { main[++nm] = $0; tail = 8; cur = ""; next }
tail > 0 && /^[ \t]/ { main[++nm] = $0; tail--; next }
{ tail = 0 }
cur != "" && /^ +[A-Za-z0-9_.-]+\.go:[0-9]+: / { n = ++count[cur]; log_[cur, n] = $0; next }
cur != "" && count[cur] > 0 { last_[cur, count[cur]] = $0 }
END {
	leaves = 0
	for (i = 1; i <= nf; i++) {
		leaf = 1
		for (j = 1; j <= nf; j++)
			if (index(order[j], order[i] "/") == 1) leaf = 0
		if (leaf) leaf_[++leaves] = order[i]
	}
	if (leaves + nm == 0) exit
	printf "\nfailures: %d test(s) failed without a failed subtest", leaves
	for (i = 1; i <= leaves; i++) printf "%s %s", (i == 1 ? ":" : ","), leaf_[i]
	print ""
	for (i = 1; i <= leaves && i <= most; i++) {
		t = leaf_[i]
		from = count[t] - lines + 1
		if (from < 1) from = 1
		printf "---- %s (its last %d of %d log calls)\n", t, count[t] - from + 1, count[t]
		for (k = from; k <= count[t]; k++) {
			print log_[t, k]
			if ((t, k) in last_) {
				l = last_[t, k]
				sub(/^[ \t]+/, "", l)
				print "        ... " substr(l, 1, 160)
			}
		}
	}
	for (i = 1; i <= nm; i++) print main[i]
}
