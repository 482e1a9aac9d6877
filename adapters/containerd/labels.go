package containerd

import (
	"strconv"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/noderuntime"
)

// Labels this adapter keeps on containers. They live in containerd's
// metadata, so a restarted agent (or one after a reboot, when tasks are
// gone) still knows what happened to its workloads.
const (
	labelPrefix = "warmfleet.runtime/"
	// labelManaged marks containers this adapter created; List shows only those.
	labelManaged = labelPrefix + "managed"
	// labelStartedAt is the agent's clock right after the task started;
	// containerd 1.6 reports no start time.
	labelStartedAt  = labelPrefix + "started-at"
	labelFinishedAt = labelPrefix + "finished-at"
	labelExitCode   = labelPrefix + "exit-code"
	labelOOMKilled  = labelPrefix + "oom-killed"
	// labelOwnOutput marks a workload whose output directory is the
	// runtime's own choice, which Remove deletes.
	labelOwnOutput = labelPrefix + "own-output"
	// labelImageDigest is the manifest digest the container's image was
	// found by, so disk collection knows what a workload holds.
	labelImageDigest = labelPrefix + "image-digest"
)

// managedFilter selects this adapter's containers in a containerd list.
const managedFilter = `labels."` + labelManaged + `"==true`

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func parseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

// userLabels drops the adapter's own labels: callers see what they set.
func userLabels(all map[string]string) map[string]string {
	out := make(map[string]string, len(all))
	for k, v := range all {
		if !strings.HasPrefix(k, labelPrefix) {
			out[k] = v
		}
	}
	return out
}

// storedExit is the exit a previous observer recorded, if any.
func storedExit(labels map[string]string) (code int, finished time.Time, ok bool) {
	s, found := labels[labelExitCode]
	if !found {
		return 0, time.Time{}, false
	}
	code, err := strconv.Atoi(s)
	if err != nil {
		return 0, time.Time{}, false
	}
	return code, parseTime(labels[labelFinishedAt]), true
}

// exitLabels records a final status for later readers.
func exitLabels(st noderuntime.WorkloadStatus) map[string]string {
	l := map[string]string{
		labelExitCode:   strconv.Itoa(st.ExitCode),
		labelFinishedAt: formatTime(st.FinishedAt),
	}
	if st.OOMKilled {
		l[labelOOMKilled] = "true"
	}
	return l
}
