package noopruntime

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The variables of a workload's environment that say how it ends, so the
// Runs of one fleet may differ (end-to-end tests of retries, preemption and
// fair share). A value that does not parse fails the Launch.
const (
	// EnvExitAfter is a Go duration ("300ms"): the workload exits this long
	// after it started, over Options.ExitAfter.
	EnvExitAfter = "NOOP_EXIT_AFTER"
	// EnvExitCode is the code it then exits with (default 0).
	EnvExitCode = "NOOP_EXIT_CODE"
	// EnvOOM "1" makes that exit an OOM kill: code 137, OOMKilled.
	EnvOOM = "NOOP_OOM"
	// EnvOOMOn lists node ids (comma-separated): the exit is an OOM kill
	// only on those, by the WARMFLEET_NODE_ID the agent sets.
	EnvOOMOn = "NOOP_OOM_ON"
	// envNodeID is the agent's variable naming the node.
	envNodeID = "WARMFLEET_NODE_ID"
)

// oomExitCode is what a process killed by the kernel's OOM killer exits
// with (128 + SIGKILL).
const oomExitCode = 137

// behaviour is how one workload ends.
type behaviour struct {
	after    time.Duration
	hasAfter bool
	code     int
	oom      bool
}

// behaviourOf reads a workload's behaviour from its environment.
func behaviourOf(env []string) (behaviour, error) {
	vars := make(map[string]string, len(env))
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	var b behaviour
	if v, ok := vars[EnvExitAfter]; ok {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return b, fmt.Errorf("noopruntime: %s=%q is not a non-negative Go duration (e.g. 300ms)", EnvExitAfter, v)
		}
		b.after, b.hasAfter = d, true
	}
	if v, ok := vars[EnvExitCode]; ok {
		c, err := strconv.Atoi(v)
		if err != nil || c < 0 || c > 255 {
			return b, fmt.Errorf("noopruntime: %s=%q is not an exit code 0..255", EnvExitCode, v)
		}
		b.code = c
	}
	switch v := vars[EnvOOM]; v {
	case "", "0":
	case "1":
		b.oom = true
	default:
		return b, fmt.Errorf("noopruntime: %s=%q: want 1 or 0", EnvOOM, v)
	}
	if v, ok := vars[EnvOOMOn]; ok {
		b.oom = b.oom || slices.Contains(strings.Split(v, ","), vars[envNodeID])
	}
	if b.oom {
		b.code = oomExitCode
	}
	return b, nil
}

// exitAfter is when the workload exits, given the runtime's default: its
// own delay, else def; a workload told how to end but not when ends at
// once. ok is false for one that runs until stopped.
func (b behaviour) exitAfter(def time.Duration) (time.Duration, bool) {
	switch {
	case b.hasAfter:
		return b.after, true
	case def > 0:
		return def, true
	case b.code != 0 || b.oom:
		return 0, true
	}
	return 0, false
}
