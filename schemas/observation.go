package schemas

import "time"

// ObservationKind names what an Observation carries.
type ObservationKind string

const (
	ObsReceipt        ObservationKind = "receipt"
	ObsWorkload       ObservationKind = "workload"
	ObsFacts          ObservationKind = "facts"
	ObsReconciliation ObservationKind = "reconciliation"
	ObsImageProgress  ObservationKind = "image_progress"
)

// Observation is what a node publishes on wf.node.<id>.obs. The control
// plane drops one stamped with a superseded fencing token.
type Observation struct {
	Version      int             `json:"version,omitempty"`
	NodeID       string          `json:"node_id"`
	FencingToken uint64          `json:"fencing_token"`
	Generation   uint64          `json:"generation"`
	Kind         ObservationKind `json:"kind"`

	Receipt        *OperationReceipt    `json:"receipt,omitempty"`
	Workload       *WorkloadObservation `json:"workload,omitempty"`
	Facts          *NodeFacts           `json:"facts,omitempty"`
	Reconciliation *Reconciliation      `json:"reconciliation,omitempty"`
	ImageProgress  *ImageProgress       `json:"image_progress,omitempty"`
}

// Receipt outcomes.
const (
	OutcomeApplied = "applied"
	OutcomeRefused = "refused" // never applied: stale token, bad payload
	OutcomeFailed  = "failed"  // applied and did not work
)

// OperationReceipt answers one Command.
type OperationReceipt struct {
	OperationID string      `json:"operation_id"`
	Kind        CommandKind `json:"kind"`
	RunID       string      `json:"run_id,omitempty"`
	AttemptID   string      `json:"attempt_id,omitempty"`
	// PrefetchID names the prefetch a PrepareImage served.
	PrefetchID string    `json:"prefetch_id,omitempty"`
	AcceptedAt time.Time `json:"accepted_at"`
	// Duplicate means this operation id was already applied; no second
	// effect happened.
	Duplicate bool   `json:"duplicate,omitempty"`
	Outcome   string `json:"outcome"`
	Code      Code   `json:"code,omitempty"`
	Message   string `json:"message,omitempty"`
}

// WorkloadPhase is a node's view of one workload.
type WorkloadPhase string

const (
	WorkloadPreparing WorkloadPhase = "preparing" // fetching or unpacking the image
	WorkloadPrepared  WorkloadPhase = "prepared"  // image ready
	WorkloadStarting  WorkloadPhase = "starting"  // created, not yet started (a launch reports it only when no prepared report came first)
	WorkloadRunning   WorkloadPhase = "running"
	WorkloadExited    WorkloadPhase = "exited"
	WorkloadFailed    WorkloadPhase = "failed" // could not be started
	WorkloadUnknown   WorkloadPhase = "unknown"
)

// WorkloadObservation is a node's report of one workload attempt. Times other
// than ReceivedAt are the node's clock; ReceivedAt is stamped by the control
// plane (invariant 7) and ignored when a node sends it.
type WorkloadObservation struct {
	RunID         string        `json:"run_id"`
	AttemptID     string        `json:"attempt_id"`
	Phase         WorkloadPhase `json:"phase"`
	ObservedAt    time.Time     `json:"observed_at"`
	ReceivedAt    time.Time     `json:"received_at,omitzero"`
	ExitCode      *int          `json:"exit_code,omitempty"`
	OOMKilled     bool          `json:"oom_killed,omitempty"`
	FailureReason string        `json:"failure_reason,omitempty"`
	// FailureCode, on a failed report, is the coded reason when it is
	// more precise than launch_failed (registry_auth_failed).
	FailureCode Code       `json:"failure_code,omitempty"`
	StartedAt   *time.Time `json:"started_at,omitempty"`
	FinishedAt  *time.Time `json:"finished_at,omitempty"`
	// StopReason is set when the node stopped the workload itself or on
	// command (e.g. "max_runtime_exceeded", "cancelled").
	StopReason string `json:"stop_reason,omitempty"`
	// Progress is set on a preparing report sent while an image is still
	// being fetched or imported, or an artifact fetched.
	Progress *TransferProgress `json:"progress,omitempty"`
	// GPUs are the cards the workload holds, by UUID, as the node
	// recorded them when it launched it.
	GPUs []string `json:"gpus,omitempty"`
}

// TransferProgress counts the bytes of an image transfer, or of an
// artifact's fetch when Artifact names one. TotalBytes is zero when the
// size is not known yet.
type TransferProgress struct {
	DoneBytes  int64 `json:"done_bytes"`
	TotalBytes int64 `json:"total_bytes,omitempty"`
	// Artifact is the artifact's catalog name when the bytes are an
	// artifact's; empty for an image.
	Artifact string `json:"artifact,omitempty"`
}

// Validate refuses negative counts, a done count past a known total and
// an artifact name that is not a catalog name.
func (p *TransferProgress) Validate() error {
	if p.DoneBytes < 0 || p.TotalBytes < 0 {
		return refuse(CodeMalformed, "progress", "byte counts must not be negative")
	}
	if p.TotalBytes > 0 && p.DoneBytes > p.TotalBytes {
		return refuse(CodeMalformed, "progress.done_bytes", "done_bytes exceeds total_bytes")
	}
	if p.Artifact != "" && !ValidArtifactName(p.Artifact) {
		return refuse(CodeMalformed, "progress.artifact", "not an artifact name")
	}
	return nil
}

// What names what is transferred: "image", or "artifact NAME".
func (p TransferProgress) What() string {
	if p.Artifact != "" {
		return "artifact " + p.Artifact
	}
	return "image"
}

// Percent is the share done, or -1 when the total is unknown.
func (p TransferProgress) Percent() float64 {
	if p.TotalBytes <= 0 {
		return -1
	}
	return 100 * float64(p.DoneBytes) / float64(p.TotalBytes)
}

// Reconciliation is a node's full account of itself after a restart or
// reconnect: what it applied and what runs there.
type Reconciliation struct {
	NodeID              string                `json:"node_id"`
	Generation          uint64                `json:"generation"`
	FencingToken        uint64                `json:"fencing_token"`
	AppliedOperationIDs []string              `json:"applied_operation_ids,omitempty"`
	Workloads           []WorkloadObservation `json:"workloads,omitempty"`
	Facts               NodeFacts             `json:"facts"`
}

// Validate checks the envelope and that the payload matches Kind.
func (o *Observation) Validate() error {
	if o.Version < 0 || o.Version > SchemaVersion {
		return refuse(CodeUnsupportedVersion, "version", "version %d is not supported", o.Version)
	}
	if err := ValidateID("node_id", o.NodeID, CodeMalformed); err != nil {
		return err
	}
	if err := CheckNodeSizes("", o); err != nil {
		return err
	}
	ok := false
	switch o.Kind {
	case ObsReceipt:
		ok = o.Receipt != nil
	case ObsWorkload:
		ok = o.Workload != nil
	case ObsFacts:
		ok = o.Facts != nil
	case ObsReconciliation:
		ok = o.Reconciliation != nil
	case ObsImageProgress:
		ok = o.ImageProgress != nil
	default:
		return refuse(CodeMalformed, "kind", "unknown observation kind")
	}
	if !ok {
		return refuse(CodeMissingField, string(o.Kind), "the payload named by kind is missing")
	}
	set := 0
	for _, p := range []bool{o.Receipt != nil, o.Workload != nil, o.Facts != nil, o.Reconciliation != nil, o.ImageProgress != nil} {
		if p {
			set++
		}
	}
	if set != 1 {
		return refuse(CodeMalformed, "kind", "exactly one payload, the one named by kind, must be set")
	}
	if w := o.Workload; w != nil {
		if err := w.validate("workload"); err != nil {
			return err
		}
	}
	if p := o.ImageProgress; p != nil {
		if err := p.validate(); err != nil {
			return err
		}
	}
	if r := o.Reconciliation; r != nil {
		for i := range r.Workloads {
			if err := r.Workloads[i].validate("reconciliation.workloads"); err != nil {
				return err
			}
		}
	}
	return nil
}

// Times a node may report: anything outside is a broken clock or a forged
// report, and would not survive being stored as JSON.
var (
	minReportTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	maxReportTime = time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC)
)

func (w *WorkloadObservation) validate(field string) error {
	if err := ValidateID(field+".run_id", w.RunID, CodeMalformed); err != nil {
		return err
	}
	if err := ValidateID(field+".attempt_id", w.AttemptID, CodeMalformed); err != nil {
		return err
	}
	for _, t := range []*time.Time{&w.ObservedAt, w.StartedAt, w.FinishedAt} {
		if t != nil && !t.IsZero() && (t.Before(minReportTime) || t.After(maxReportTime)) {
			return refuse(CodeMalformed, field, "a reported time is outside 2000–9000; check the node's clock")
		}
	}
	if len(w.FailureReason) > MaxStringBytes || len(w.StopReason) > 256 || len(w.FailureCode) > 64 {
		return refuse(CodeValueTooLong, field, "reasons are bounded")
	}
	if w.Progress != nil {
		if w.Phase != WorkloadPreparing {
			return refuse(CodeMalformed, field+".progress", "progress is reported only while preparing")
		}
		return w.Progress.Validate()
	}
	return nil
}
