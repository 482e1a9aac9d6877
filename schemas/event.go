package schemas

import (
	"cmp"
	"slices"
	"time"
)

// EventType classifies a RunEvent.
type EventType string

const (
	EventAccepted EventType = "accepted"
	EventRejected EventType = "rejected"
	EventDecided  EventType = "decided"
	EventPhase    EventType = "phase"
	EventCancel   EventType = "cancel_requested"
	EventNote     EventType = "note" // an observation worth recording that moves no phase
	// EventProgress records how far an image or artifact transfer has
	// come; it moves no phase and is sent at most once per the node's
	// progress interval.
	EventProgress EventType = "progress"
	// EventAttemptEnded records an ended attempt's cost (Usage); the
	// control plane also publishes it on wf.usage.<tenant>.
	EventAttemptEnded EventType = "attempt_ended"
)

// RunEvent is one entry of a Run's audit log on wf.events.<tenant>.run.<run_id>.
type RunEvent struct {
	RunID     string    `json:"run_id"`
	Seq       uint64    `json:"seq"`
	Type      EventType `json:"type"`
	RequestID string    `json:"request_id,omitempty"`
	From      Phase     `json:"from,omitempty"`
	Phase     Phase     `json:"phase,omitempty"`
	NodeID    string    `json:"node_id,omitempty"`
	Attempt   int       `json:"attempt,omitempty"`
	Code      Code      `json:"code,omitempty"`
	Field     string    `json:"field,omitempty"`
	Message   string    `json:"message,omitempty"`
	ExitCode  *int      `json:"exit_code,omitempty"`
	OOMKilled bool      `json:"oom_killed,omitempty"`
	// GPUs are the cards the attempt holds, by UUID, on the events that
	// book or start it.
	GPUs []string `json:"gpus,omitempty"`
	// At is the control plane's clock when it recorded the event.
	At time.Time `json:"at"`
	// ObservedAt is the node's clock for events caused by a node's report.
	ObservedAt *time.Time        `json:"observed_at,omitempty"`
	Decision   *BookingDecision  `json:"decision,omitempty"`
	Progress   *TransferProgress `json:"progress,omitempty"`
	// Usage is the ended attempt's record, on attempt_ended events.
	Usage *AttemptRecord `json:"usage,omitempty"`
}

// Decided reports whether ev records a placement decision: a decided
// event, or the accepted event of a Run that intake decided as it stored
// it (no node fits now), which carries that first decision.
func (ev RunEvent) Decided() bool {
	return ev.Type == EventDecided || (ev.Type == EventAccepted && ev.Decision != nil)
}

// BookingDecision records a placement: the winner and why every other
// candidate lost (invariant 4).
type BookingDecision struct {
	RunID   string `json:"run_id"`
	Attempt int    `json:"attempt"`
	Winner  string `json:"winner,omitempty"`
	// WinnerQueued means the winner is busy and the Run waits in its queue
	// (it prefetches its image meanwhile).
	WinnerQueued bool `json:"winner_queued,omitempty"`
	// FetchFirst means the winner lacks some of the Run's image or
	// artifacts and prepares ahead: the Run is booked in its queue to
	// fetch them and claims its cards only once they are there (until
	// then the cards stay free for Runs that can start now).
	FetchFirst bool `json:"fetch_first,omitempty"`
	// GPUs are the winner's cards booked to the attempt, by UUID; empty
	// when it asks for none or waits in the winner's queue (its cards are
	// chosen when it starts).
	GPUs       []string    `json:"gpus,omitempty"`
	Candidates []Candidate `json:"candidates"`
	// Others lists, by reason, the candidates recorded by node id alone. A
	// decision over a large fleet is compacted before it is stored
	// (Compact): full entries for the winner, the best losers and a few
	// examples of each reason, the rest here, so that every rejected node
	// is still named with its reason and the record stays far inside a
	// NATS message.
	Others    map[Code][]string `json:"others,omitempty"`
	DecidedAt time.Time         `json:"decided_at"`
	// Victims are the running Runs this decision preempts to make room,
	// each with why it was chosen.
	Victims []Victim `json:"victims,omitempty"`
}

// Queues reports whether d books its Run in the winner's queue: behind
// its running work (WinnerQueued), or to fetch its bytes first
// (FetchFirst).
func (d BookingDecision) Queues() bool { return d.WinnerQueued || d.FetchFirst }

// examplesPerReason is how many full entries Compact keeps of each reason.
const examplesPerReason = 3

// Compact returns d with at most limit full candidate entries: the winner,
// up to half the limit of the cheapest eligible losers, then examples of
// each reason in turn; every other candidate is named under Others by its
// reason. Kept entries stay in d's order. A limit ≤ 0, or a decision that
// fits, is returned as is.
func (d BookingDecision) Compact(limit int) BookingDecision {
	if limit <= 0 || len(d.Candidates) <= limit {
		return d
	}
	keep := make([]bool, len(d.Candidates))
	kept := 0
	take := func(i int) {
		if !keep[i] && kept < limit {
			keep[i], kept = true, kept+1
		}
	}
	var eligible []int
	for i, c := range d.Candidates {
		switch {
		case c.NodeID == d.Winner && d.Winner != "":
			take(i)
		case c.Eligible:
			eligible = append(eligible, i)
		}
	}
	slices.SortStableFunc(eligible, func(a, b int) int { return cmp.Compare(d.Candidates[a].Cost, d.Candidates[b].Cost) })
	for _, i := range eligible[:min(len(eligible), limit/2)] {
		take(i)
	}
	seen := map[Code]int{}
	for i, c := range d.Candidates {
		if !keep[i] && seen[c.Reason] < examplesPerReason {
			seen[c.Reason]++
			take(i)
		}
	}
	out := d
	out.Candidates = make([]Candidate, 0, kept)
	out.Others = map[Code][]string{}
	for k, v := range d.Others {
		out.Others[k] = slices.Clone(v)
	}
	for i, c := range d.Candidates {
		if keep[i] {
			out.Candidates = append(out.Candidates, c)
			continue
		}
		out.Others[c.Reason] = append(out.Others[c.Reason], c.NodeID)
	}
	return out
}

// Candidate is one node considered for a booking.
type Candidate struct {
	NodeID   string `json:"node_id"`
	Eligible bool   `json:"eligible"`
	Reason   Code   `json:"reason,omitempty"` // why an ineligible or losing node lost
	Detail   string `json:"detail,omitempty"`
	// Cost is the score, lower wins: seconds until the Run could start plus
	// price converted to seconds.
	Cost       float64         `json:"cost,omitempty"`
	Components ScoreComponents `json:"components,omitzero"`
	// Free is what the node had unreserved when the decision was made.
	Free Resources `json:"free"`
}

// ScoreComponents explain a Cost.
type ScoreComponents struct {
	ImageState     string  `json:"image_state,omitempty"`
	PullBytes      int64   `json:"pull_bytes,omitempty"`
	PullSeconds    float64 `json:"pull_seconds,omitempty"`
	CachesWarm     int     `json:"caches_warm,omitempty"`
	CacheFillBytes int64   `json:"cache_fill_bytes,omitempty"`
	CacheSeconds   float64 `json:"cache_seconds,omitempty"`
	// ArtifactFetchBytes are the bytes of the Run's artifacts the node
	// would still fetch (all of them from a node that did not enumerate),
	// timed at the pull rate in ArtifactSeconds.
	ArtifactsWarm      int     `json:"artifacts_warm,omitempty"`
	ArtifactFetchBytes int64   `json:"artifact_fetch_bytes,omitempty"`
	ArtifactSeconds    float64 `json:"artifact_seconds,omitempty"`
	QueueSeconds       float64 `json:"queue_seconds,omitempty"`
	StartSeconds       float64 `json:"start_seconds"`
	PricePerHour       float64 `json:"price_per_hour,omitempty"`
	// PenaltySeconds is added to a node an earlier attempt of the Run
	// failed on.
	PenaltySeconds float64 `json:"penalty_seconds,omitempty"`
	// IdleGPUSeconds prices the cards held idle while the Run's bytes
	// arrive (the policy's GPU-hour price, in seconds).
	IdleGPUSeconds float64 `json:"idle_gpu_seconds,omitempty"`
	// LinkBusySeconds is how long the node's link is still busy with the
	// bytes of other bookings fetching there: the Run's own fetch comes
	// after them.
	LinkBusySeconds float64 `json:"link_busy_seconds,omitempty"`
	// DisplaceSeconds prices taking cards that a booking fetching its
	// bytes on the node counts on: that booking would wait about as long
	// as this Run holds them.
	DisplaceSeconds float64 `json:"displace_seconds,omitempty"`
}

// FetchesBytes reports whether the Run would pull image layers or fetch
// artifacts on the candidate's node (caches are filled by the workload).
func (k ScoreComponents) FetchesBytes() bool { return k.PullBytes+k.ArtifactFetchBytes > 0 }

// Placement reason codes.
const (
	ReasonInsufficientCPU    Code = "insufficient_cpu"
	ReasonInsufficientMemory Code = "insufficient_memory"
	ReasonInsufficientGPU    Code = "insufficient_gpu"
	ReasonInsufficientDisk   Code = "insufficient_disk"
	ReasonDiskUnknown        Code = "disk_unknown"
	ReasonGPUModelMismatch   Code = "gpu_model_mismatch"
	// ReasonGPUNotInjectable: the node's cards have no CDI device the agent
	// can hand a container (no usable CDI spec, or an agent that does not
	// report cards by identity), so a GPU Run would run without its GPUs.
	ReasonGPUNotInjectable Code = "gpu_not_injectable"
	ReasonDriverMissing    Code = "driver_missing"
	ReasonDriverTooOld     Code = "driver_too_old"
	ReasonPlatformMismatch Code = "platform_mismatch"
	ReasonLeaseStale       Code = "lease_stale"
	ReasonFactsStale       Code = "facts_stale"
	ReasonNodeNotReady     Code = "node_not_ready"
	ReasonNodeDraining     Code = "node_draining"
	ReasonAtCapacity       Code = "at_max_workloads"
	ReasonQueueFull        Code = "queue_full"
	ReasonOutscored        Code = "outscored"
	// ReasonNetworkUnavailable: the node does not offer the Run's network
	// mode (HostFacts.NetworkModes), e.g. host networking is forbidden there.
	ReasonNetworkUnavailable Code = "network_unavailable"
	// ReasonCacheMountsUnsupported: the Run mounts caches and the node
	// declares no cache mounts (NodeSupport.CacheMounts).
	ReasonCacheMountsUnsupported Code = "cache_mounts_unsupported"
	// ReasonArtifactsUnsupported: the Run mounts artifacts and the node
	// declares no replica store (NodeSupport.ArtifactReplicas).
	ReasonArtifactsUnsupported Code = "artifacts_unsupported"
)
