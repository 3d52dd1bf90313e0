package pipeline

import (
	"context"
	"time"
)

// describeMetrics describes the series the runner reports, and registers
// the gauges read from its state at each scrape.
func describeMetrics(r *Runner) {
	r.Metrics.Help("ctxpipe_inputs_total", "Inputs by outcome (applied, rejected, duplicate).")
	r.Metrics.Help("ctxpipe_events_total", "Events committed to the outbox, by type.")
	r.Metrics.Help("ctxpipe_retries_total", "Worker retries of transient failures.")
	r.Metrics.Help("ctxpipe_commits_total", "SQLite transactions committed.")
	r.Metrics.Help("ctxpipe_consumer_rebuilds_total", "Times the runner rebuilt a partition's consumer after a fetch failure.")
	r.Metrics.Help("ctxpipe_changelog_lost_total", "Appends refused because records this store applied are gone from CTX_STATE (purged or recreated): nothing commits until it is restored, and /readyz says so.")
	r.Metrics.Help("ctxpipe_changelog_fenced_total", "Batches prepared again because another writer appended to the partition first (the append was refused, or its record was applied while they were prepared).")
	r.Metrics.Help("ctxpipe_changelog_applied_total", "Changelog records of other writers (or of this instance before a crash) applied to this instance's SQLite.")
	r.Metrics.Help("ctxpipe_changelog_changes_total", "Inputs' changes applied from those records (not counted in ctxpipe_inputs_total).")
	r.Metrics.Help("ctxpipe_changelog_unreadable_total", "Changelog messages or records skipped because they could not be read or applied.")
	r.Metrics.Help("ctxpipe_changelog_reread_total", "Changelog messages read again because this instance took them for its own records but its store lacks them.")
	r.Metrics.Help("ctxpipe_input_stage_seconds", "Where committed inputs spent their time, summed per input: delivery (stored in CTX_IN, by the server's clock, to fetched here), queued (fetched to taken by a worker), prepare (the eng), commit (the commit round, fsync included).")
	r.Metrics.Help("ctxpipe_commit_file_seconds", "Time each file's committer spent on its commit rounds (the SQL, the wait for the appends, the commit): the serial part of that file's commits.")
	r.Metrics.Help("ctxpipe_partition_terms_total", "Partitions this instance took (a new pin: catch up, replay the unacked inputs).")
	r.Metrics.Help("ctxpipe_partitions_adopted_total", "Partitions whose unacked inputs this instance applied because their owner went silent while nobody held the pin (no new input to start a term).")
	r.Metrics.Gauge("ctxpipe_partitions_owned", "Partitions this instance received inputs for, under its pin, in the last 30 s.", func(context.Context) (float64, error) {
		return float64(r.own.owned()), nil
	})
	r.Metrics.Gauge("ctxpipe_changelog_cursor", "CTX_STATE sequence up to which this instance has applied the changelog of the partitions it holds.", func(context.Context) (float64, error) {
		return float64(r.Cursor()), nil
	})
	r.Metrics.Gauge("ctxpipe_partitions_pulling", "Partitions whose inputs this instance pulls now: those it is preferred for among the live instances, restored.", func(context.Context) (float64, error) {
		if r.nParts.Load() == 0 {
			return 0, nil
		}
		return float64(len(r.own.pullStarts())), nil
	})
	r.Metrics.Help("ctxpipe_partitions_restored_total", "Partitions this instance gained (as owner or standby) and restored from the changelog.")
	r.Metrics.Help("ctxpipe_partition_restore_seconds", "From gaining a partition to holding its changelog up to its last record then.")
	r.Metrics.Gauge("ctxpipe_partitions_held", "Partitions whose state this instance keeps (owner or standby) and has restored.", func(context.Context) (float64, error) {
		if r.nParts.Load() == 0 {
			return 0, nil
		}
		_, n := r.own.holds.counts()
		return float64(n), nil
	})
	r.Metrics.Gauge("ctxpipe_changelog_behind", "Partitions held whose last changelog record this instance has not applied yet (one request per partition held, at each scrape).", func(ctx context.Context) (float64, error) {
		n, err := r.Behind(ctx)
		return float64(n), err
	})
	r.Metrics.Gauge("ctxpipe_last_fetch_age_seconds", "Seconds since the runner last heard from its consumer (a message or a successful consumer check); -1 before the first.", func(context.Context) (float64, error) {
		age, ok := r.health.fetchAge(time.Now())
		if !ok {
			return -1, nil
		}
		return age.Seconds(), nil
	})
}
