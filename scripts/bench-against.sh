#!/usr/bin/env bash
# bench-against.sh REV [ROUNDS]: BenchmarkPipeline of the pipeline package at
# REV beside the working tree, run alternately on the same machine, and a
# table of what each build costs per applied turn with the ratios new/old.
#
# Both test binaries are built first (REV in a temporary git worktree beside
# the repository, so that ../shared resolves as it does for the repository;
# it is removed afterwards), then each round runs them one after the other,
# the order swapped every round so that a drift of the machine's load falls
# on both. Environment: ROUNDS (default 3), BENCHTIME (a count, Nx; default 3x), BENCH
# (default 'Pipeline$'); CTXPIPE_BENCH_FILES passes through to the builds
# that read it.
#
# What the table compares, per build (the median of its rounds):
#   turns/s         as the benchmark reports it (the last iteration's).
#   cpu-µs/turn     the process's CPU (pipeline and in-process nats-server)
#                   per applied turn: cpu-µs/turn where the build reports it,
#                   else cpu-cores ÷ turns/s, which is the same quantity.
#   committer-µs/turn  the serial part: busiest-committer-µs/turn where the
#                   build reports it (one committer per file, in parallel,
#                   the busiest one's apply+append+sync), else the single
#                   committer's (apply-ms + append-ms + sync-ms) per turn.
#   commit-all-µs/turn (apply-ms + append-ms + sync-ms) per turn: all
#                   committers' time together, the same sum in both builds.
#   serial-cpu-µs/turn  the CPU the committer goroutine itself used per turn
#                   (from a CPU profile of each run): where the build labels
#                   its committers by file (pprof label "file"), the busiest
#                   one's; else the one committer's (Runner.committer). The
#                   committer times above are wall time, and on a machine
#                   whose cores the run keeps busy they are mostly waits for
#                   a core, the appends and the fsync; this is the work that
#                   only one goroutine can do.
# The ratios new/old are of the medians; "pairs" is the median of each
# round's own ratio (the two runs of a round ran back to back).
set -euo pipefail

usage() { echo "usage: $0 REV [ROUNDS]   (env ROUNDS, BENCHTIME, BENCH)" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
REV=$1
ROUNDS=${2:-${ROUNDS:-3}}
BENCHTIME=${BENCHTIME:-3x}
BENCH=${BENCH:-'Pipeline$'}
GO=${GO:-go}
# runs is how many times the benchmark function runs in one process: once
# with b.N = 1, then (-benchtime Nx, N > 1) once more with b.N = N; a
# profile's CPU is divided by the turns of all of them.
n=${BENCHTIME%x}
case $n in '' | *[!0-9]*) echo "$0: BENCHTIME must be Nx (a count), not $BENCHTIME" >&2; exit 2 ;; esac
runs=$((n > 1 ? n + 1 : 1))

root=$(git rev-parse --show-toplevel)
commit=$(git -C "$root" rev-parse --verify --quiet "$REV^{commit}") || { echo "$0: $REV is not a commit" >&2; exit 2; }
short=$(git -C "$root" rev-parse --short "$commit")
transcripts=$(dirname "$root")/shared/data/transcripts
ls "$transcripts"/*.jsonl >/dev/null 2>&1 || { echo "$0: no transcripts under $transcripts" >&2; exit 1; }
# Every line of a transcript is one turn; the benchmark publishes them all.
turns=$(awk 'END { print NR }' "$transcripts"/*.jsonl)

work=$(mktemp -d)
old=$(dirname "$root")/.bench-against-$short-$$
cleanup() {
	if [ -d "$old" ]; then git -C "$root" worktree remove --force "$old" >/dev/null 2>&1 || rm -rf "$old"; fi
	git -C "$root" worktree prune
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "building the pipeline test binary at $short and at the working tree..." >&2
git -C "$root" worktree add --detach --quiet "$old" "$commit"
(cd "$old" && $GO test -c -o "$work/old.test" ./pipeline/)
(cd "$root" && $GO test -c -o "$work/new.test" ./pipeline/)

run() { # run BUILD ROUND: one benchmark process, its result line kept
	local build=$1 round=$2 dir bin line
	if [ "$build" = old ]; then dir=$old; else dir=$root; fi
	bin=$work/$build.test
	echo "round $round: $build" >&2
	prof=$work/$build-$round.pprof
	line=$(cd "$dir/pipeline" && "$bin" -test.run '^$' -test.bench "$BENCH" -test.benchtime "$BENCHTIME" -test.cpuprofile "$prof" | grep '^Benchmark' | tail -n 1) ||
		{ echo "$0: the $build build's benchmark failed" >&2; exit 1; }
	echo "$line" >&2
	echo "$build $round $line $(serial_cpu "$bin" "$prof") serial-cpu-µs/turn" >>"$work/results"
}

serial_cpu() { # serial_cpu BIN PROFILE: the committer's CPU µs per turn
	local bin=$1 prof=$2 s
	s=$($GO tool pprof -tags -focus 'committer\).run$' "$bin" "$prof" 2>/dev/null | awk '
		/^ file:/ { on = 1; next }
		on && /^ [^ ]/ { on = 0 }
		on && $1 ~ /s$/ { v = $1; u = (v ~ /ms$/) ? 1e-3 : 1; sub(/m?s$/, "", v); if (v * u > m) m = v * u }
		END { if (m > 0) print m }')
	if [ -z "$s" ]; then # one committer, not labelled
		s=$($GO tool pprof -top -focus 'Runner\).committer$' "$bin" "$prof" 2>/dev/null | awk '
			/^Showing nodes accounting for/ { v = $5; sub(/,$/, "", v); u = (v ~ /ms$/) ? 1e-3 : 1; sub(/m?s$/, "", v); print v * u; exit }')
	fi
	awk -v s="${s:-0}" -v t="$turns" -v r="$runs" 'BEGIN { printf "%.2f", s * 1e6 / (t * r) }'
}
for ((i = 1; i <= ROUNDS; i++)); do
	if ((i % 2)); then run old "$i"; run new "$i"; else run new "$i"; run old "$i"; fi
done

echo
echo "BenchmarkPipeline ($BENCH, -benchtime $BENCHTIME), $ROUNDS rounds, $turns turns a run, $(nproc) cores, $(date -u +%FT%TZ)"
echo "old = $short; new = the working tree at $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- . 2>/dev/null || echo '+changes')"
awk -v turns="$turns" '
function val(unit) { return (unit in m) ? m[unit] : "" }
function median(build, col,   n, i, j, t, a) {
	n = 0
	for (i = 1; i <= rounds; i++) if ((build, i, col) in v) a[++n] = v[build, i, col]
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	if (n == 0) return ""
	return (n % 2) ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
function mediana(arr, n,   i, j, t) {
	for (i = 2; i <= n; i++) for (j = i; j > 1 && arr[j-1] > arr[j]; j--) { t = arr[j]; arr[j] = arr[j-1]; arr[j-1] = t }
	return (n % 2) ? arr[(n+1)/2] : (arr[n/2] + arr[n/2+1]) / 2
}
{
	build = $1; round = $2; delete m
	for (i = 5; i < NF; i += 2) m[$(i+1)] = $i
	if (round > rounds) rounds = round
	v[build, round, "turns/s"] = val("turns/s")
	cpu = val("cpu-µs/turn"); if (cpu == "") cpu = val("cpu-cores") * 1e6 / val("turns/s")
	v[build, round, "cpu"] = cpu
	all = (val("apply-ms") + val("append-ms") + val("sync-ms")) * 1000 / turns
	v[build, round, "all"] = all
	c = val("busiest-committer-µs/turn"); if (c == "") { c = all; src[build] = "apply+append+sync" } else src[build] = "busiest-committer"
	v[build, round, "committer"] = c
	v[build, round, "serial"] = val("serial-cpu-µs/turn")
}
END {
	cols = "turns/s cpu committer all serial"; ncol = split(cols, col, " ")
	fmt[1] = " %10.3f"; fmt[2] = " %12.3f"; fmt[3] = " %18.3f"; fmt[4] = " %19.3f"; fmt[5] = " %19.3f"
	hdr = sprintf("%-6s %-6s %10s %12s %18s %19s %19s", "build", "round", "turns/s", "cpu-µs/turn", "committer-µs/turn", "commit-all-µs/turn", "serial-cpu-µs/turn")
	print hdr
	for (i = 1; i <= rounds; i++) for (b = 1; b <= 2; b++) {
		build = (b == 1) ? "old" : "new"
		if (!((build, i, "cpu") in v)) continue
		printf "%-6s %-6d %10.0f %12.1f %18.1f %19.1f %19.1f\n", build, i, v[build, i, "turns/s"], v[build, i, "cpu"], v[build, i, "committer"], v[build, i, "all"], v[build, i, "serial"]
	}
	for (b = 1; b <= 2; b++) {
		build = (b == 1) ? "old" : "new"
		printf "%-6s %-6s %10.0f %12.1f %18.1f %19.1f %19.1f\n", build, "median", median(build, "turns/s"), median(build, "cpu"), median(build, "committer"), median(build, "all"), median(build, "serial")
	}
	printf "%-6s %-6s", "new/old", "median"
	for (k = 1; k <= ncol; k++) printf fmt[k], median("new", col[k]) / median("old", col[k])
	printf "\n%-6s %-6s", "new/old", "pairs"
	for (k = 1; k <= ncol; k++) {
		n = 0; delete r
		for (i = 1; i <= rounds; i++) if ((("old", i, col[k]) in v) && (("new", i, col[k]) in v) && v["old", i, col[k]] > 0) r[++n] = v["new", i, col[k]] / v["old", i, col[k]]
		printf fmt[k], (n ? mediana(r, n) : 0)
	}
	printf "\n"
	printf "committer-µs/turn: old = %s, new = %s\n", src["old"], src["new"]
	printf "serial-cpu-µs/turn: the committer goroutine'"'"'s CPU (the busiest file'"'"'s where labelled), from each run'"'"'s CPU profile\n"
}' "$work/results"
