package schemas_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// wantRefusal fails t unless err is a *schemas.Refusal with code and field;
// code "" means err must be nil, field "*" any non-empty field.
func wantRefusal(t *testing.T, err error, code schemas.Code, field string) {
	t.Helper()
	if code == "" {
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		return
	}
	r, ok := err.(*schemas.Refusal)
	if !ok {
		t.Fatalf("error = %T %v, want *schemas.Refusal %s on %q", err, err, code, field)
	}
	if r.Code != code || (field == "*" && r.Field == "") || (field != "*" && r.Field != field) {
		t.Fatalf("refusal = %s on %q (%s), want %s on %q", r.Code, r.Field, r.Reason, code, field)
	}
	if r.Reason == "" {
		t.Error("refusal has no reason")
	}
}

func TestCancelRunValidate(t *testing.T) {
	reqID := "req-1"
	runID := schemas.RunIDFor(schemas.DefaultTenant, reqID)
	for _, tc := range []struct {
		name      string
		in        schemas.CancelRun
		code      schemas.Code
		field     string
		wantRunID string
	}{
		{name: "by run id", in: schemas.CancelRun{RunID: runID}, wantRunID: runID},
		{name: "by any valid run id", in: schemas.CancelRun{RunID: "r-custom"}, wantRunID: "r-custom"},
		{name: "by request id resolves run id", in: schemas.CancelRun{RequestID: reqID}, wantRunID: runID},
		{name: "both agreeing", in: schemas.CancelRun{RunID: runID, RequestID: reqID}, wantRunID: runID},
		{name: "grace at limit", in: schemas.CancelRun{RunID: runID, GraceSeconds: schemas.MaxGraceSeconds}, wantRunID: runID},
		{name: "version 1", in: schemas.CancelRun{Version: 1, RunID: runID}, wantRunID: runID},
		{name: "reason at limit", in: schemas.CancelRun{RunID: runID, Reason: strings.Repeat("r", 512)}, wantRunID: runID},

		{name: "both conflicting", in: schemas.CancelRun{RunID: schemas.RunIDFor(schemas.DefaultTenant, "other"), RequestID: reqID}, code: schemas.CodeInvalidRunID, field: "run_id"},
		{name: "request id given as run id", in: schemas.CancelRun{RunID: reqID, RequestID: reqID}, code: schemas.CodeInvalidRunID, field: "run_id"},
		{name: "neither", in: schemas.CancelRun{Reason: "stop"}, code: schemas.CodeMissingField, field: "run_id"},
		{name: "bad run id", in: schemas.CancelRun{RunID: "r/1"}, code: schemas.CodeInvalidRunID, field: "run_id"},
		{name: "bad request id", in: schemas.CancelRun{RequestID: "-x"}, code: schemas.CodeInvalidRequestID, field: "request_id"},
		{name: "bad request id beside good run id", in: schemas.CancelRun{RunID: runID, RequestID: "a b"}, code: schemas.CodeInvalidRequestID, field: "request_id"},
		{name: "version 2", in: schemas.CancelRun{Version: 2, RunID: runID}, code: schemas.CodeUnsupportedVersion, field: "version"},
		{name: "negative version", in: schemas.CancelRun{Version: -1, RunID: runID}, code: schemas.CodeUnsupportedVersion, field: "version"},
		{name: "negative grace", in: schemas.CancelRun{RunID: runID, GraceSeconds: -1}, code: schemas.CodeInvalidGrace, field: "grace_seconds"},
		{name: "grace too long", in: schemas.CancelRun{RunID: runID, GraceSeconds: schemas.MaxGraceSeconds + 1}, code: schemas.CodeInvalidGrace, field: "grace_seconds"},
		{name: "reason too long", in: schemas.CancelRun{RunID: runID, Reason: strings.Repeat("r", 513)}, code: schemas.CodeValueTooLong, field: "reason"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.in
			err := c.Validate(schemas.DefaultTenant)
			wantRefusal(t, err, tc.code, tc.field)
			if tc.code == "" && c.RunID != tc.wantRunID {
				t.Errorf("RunID = %q, want %q", c.RunID, tc.wantRunID)
			}
			if tc.code == "" {
				// Validating again is stable.
				again := c
				if err := again.Validate(schemas.DefaultTenant); err != nil || again != c {
					t.Errorf("second Validate = %v, %+v", err, again)
				}
			}
		})
	}
	// A request id names a Run of the canceller's tenant.
	c := schemas.CancelRun{RequestID: reqID}
	if err := c.Validate("acme"); err != nil || c.RunID != schemas.RunIDFor("acme", reqID) || c.RunID == runID {
		t.Fatalf("cancel by request id in tenant acme: %+v, %v", c, err)
	}
	c = schemas.CancelRun{RunID: runID, RequestID: reqID}
	wantRefusal(t, c.Validate("acme"), schemas.CodeInvalidRunID, "run_id")
}

func validCommand(kind schemas.CommandKind) schemas.Command {
	c := schemas.Command{
		OperationID:  "op-1",
		NodeID:       "node-1",
		FencingToken: 3,
		Generation:   1,
		Kind:         kind,
		IssuedAt:     time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	switch kind {
	case schemas.CmdPrepareImage:
		c.PrepareImage = &schemas.PrepareImage{Reference: testImage, ManifestDigest: testDigest, Unpack: true}
	case schemas.CmdLaunchWorkload:
		c.Launch = &schemas.LaunchWorkload{RunID: "r-1", AttemptID: "r-1-a1", Reference: testImage, ManifestDigest: testDigest}
	case schemas.CmdStopWorkload:
		c.Stop = &schemas.StopWorkload{RunID: "r-1", AttemptID: "r-1-a1", GraceSeconds: 10}
	}
	return c
}

func TestCommandValidate(t *testing.T) {
	prep := validCommand(schemas.CmdPrepareImage).PrepareImage
	launch := validCommand(schemas.CmdLaunchWorkload).Launch
	stop := validCommand(schemas.CmdStopWorkload).Stop
	for _, tc := range []struct {
		name  string
		kind  schemas.CommandKind
		mod   func(*schemas.Command)
		code  schemas.Code
		field string
	}{
		{name: "prepare", kind: schemas.CmdPrepareImage},
		{name: "launch", kind: schemas.CmdLaunchWorkload},
		{name: "stop", kind: schemas.CmdStopWorkload},
		{name: "reconcile", kind: schemas.CmdReconcile},
		{name: "version 1", kind: schemas.CmdReconcile, mod: func(c *schemas.Command) { c.Version = 1 }},

		{name: "version 2", kind: schemas.CmdReconcile, mod: func(c *schemas.Command) { c.Version = 2 }, code: schemas.CodeUnsupportedVersion, field: "version"},
		{name: "missing operation id", kind: schemas.CmdReconcile, mod: func(c *schemas.Command) { c.OperationID = "" }, code: schemas.CodeMissingField, field: "operation_id"},
		{name: "bad operation id", kind: schemas.CmdReconcile, mod: func(c *schemas.Command) { c.OperationID = "op 1" }, code: schemas.CodeMalformed, field: "operation_id"},
		{name: "bad node id", kind: schemas.CmdReconcile, mod: func(c *schemas.Command) { c.NodeID = "node.*" }, code: schemas.CodeMalformed, field: "node_id"},
		{name: "zero fencing token", kind: schemas.CmdStopWorkload, mod: func(c *schemas.Command) { c.FencingToken = 0 }, code: schemas.CodeStaleFencingToken, field: "fencing_token"},
		{name: "unknown kind", kind: "reboot", code: schemas.CodeMalformed, field: "kind"},
		{name: "empty kind", kind: "", code: schemas.CodeMalformed, field: "kind"},
		{name: "unknown kind with payload", kind: "reboot", mod: func(c *schemas.Command) { c.Stop = stop }, code: schemas.CodeMalformed, field: "kind"},
		{name: "prepare without payload", kind: schemas.CmdPrepareImage, mod: func(c *schemas.Command) { c.PrepareImage = nil }, code: schemas.CodeMalformed, field: "prepare_image"},
		{name: "prepare with launch payload", kind: schemas.CmdPrepareImage, mod: func(c *schemas.Command) { c.PrepareImage, c.Launch = nil, launch }, code: schemas.CodeMalformed, field: "prepare_image"},
		{name: "prepare with two payloads", kind: schemas.CmdPrepareImage, mod: func(c *schemas.Command) { c.Launch = launch }, code: schemas.CodeMalformed, field: "prepare_image"},
		// For a mismatch the refusal names the kind ("launch_workload"), not the
		// payload's wire field ("launch"); which one is not pinned here.
		{name: "launch with stop payload", kind: schemas.CmdLaunchWorkload, mod: func(c *schemas.Command) { c.Launch, c.Stop = nil, stop }, code: schemas.CodeMalformed, field: "*"},
		{name: "stop with prepare payload", kind: schemas.CmdStopWorkload, mod: func(c *schemas.Command) { c.Stop, c.PrepareImage = nil, prep }, code: schemas.CodeMalformed, field: "*"},
		{name: "stop with all payloads", kind: schemas.CmdStopWorkload, mod: func(c *schemas.Command) { c.PrepareImage, c.Launch = prep, launch }, code: schemas.CodeMalformed, field: "*"},
		{name: "reconcile with payload", kind: schemas.CmdReconcile, mod: func(c *schemas.Command) { c.Stop = stop }, code: schemas.CodeMalformed, field: "reconcile"},
		{name: "launch missing attempt id", kind: schemas.CmdLaunchWorkload, mod: func(c *schemas.Command) { l := *launch; l.AttemptID = ""; c.Launch = &l }, code: schemas.CodeMissingField, field: "launch.attempt_id"},
		{name: "launch bad attempt id", kind: schemas.CmdLaunchWorkload, mod: func(c *schemas.Command) { l := *launch; l.AttemptID = "../x"; c.Launch = &l }, code: schemas.CodeMalformed, field: "launch.attempt_id"},
		{name: "launch by tag", kind: schemas.CmdLaunchWorkload, mod: func(c *schemas.Command) { l := *launch; l.Reference = "busybox:latest"; c.Launch = &l }, code: schemas.CodeImageNotPinned, field: "launch.reference"},
		{name: "launch bad digest", kind: schemas.CmdLaunchWorkload, mod: func(c *schemas.Command) { l := *launch; l.Reference = "busybox@sha256:00"; c.Launch = &l }, code: schemas.CodeInvalidDigest, field: "launch.reference"},
		{name: "launch unknown network", kind: schemas.CmdLaunchWorkload, mod: func(c *schemas.Command) { l := *launch; l.Network = "overlay"; c.Launch = &l }, code: schemas.CodeInvalidNetwork, field: "launch.network"},
		{name: "launch bad ulimit", kind: schemas.CmdLaunchWorkload, mod: func(c *schemas.Command) {
			l := *launch
			l.Ulimits = []schemas.Ulimit{{Name: "nofile", Soft: 9, Hard: 8}}
			c.Launch = &l
		}, code: schemas.CodeInvalidUlimit, field: "launch.ulimits[0].soft"},
		{name: "launch negative shm", kind: schemas.CmdLaunchWorkload, mod: func(c *schemas.Command) { l := *launch; l.ShmBytes = -1; c.Launch = &l }, code: schemas.CodeInvalidShm, field: "launch.shm_bytes"},
		{name: "prepare for a platform", kind: schemas.CmdPrepareImage, mod: func(c *schemas.Command) {
			p := *prep
			p.Platform = &schemas.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}
			c.PrepareImage = &p
		}},
		{name: "launch for a platform", kind: schemas.CmdLaunchWorkload, mod: func(c *schemas.Command) {
			l := *launch
			l.Platform = &schemas.Platform{OS: "linux", Architecture: "amd64"}
			c.Launch = &l
		}},
		{name: "prepare platform without architecture", kind: schemas.CmdPrepareImage, mod: func(c *schemas.Command) {
			p := *prep
			p.Platform = &schemas.Platform{OS: "linux"}
			c.PrepareImage = &p
		}, code: schemas.CodeInvalidPlatform, field: "prepare_image.platform"},
		{name: "launch platform with a bad variant", kind: schemas.CmdLaunchWorkload, mod: func(c *schemas.Command) {
			l := *launch
			l.Platform = &schemas.Platform{OS: "linux", Architecture: "arm64", Variant: "v8/../x"}
			c.Launch = &l
		}, code: schemas.CodeInvalidPlatform, field: "launch.platform"},
		{name: "launch platform in capitals", kind: schemas.CmdLaunchWorkload, mod: func(c *schemas.Command) {
			l := *launch
			l.Platform = &schemas.Platform{OS: "Linux", Architecture: "AMD64"}
			c.Launch = &l
		}, code: schemas.CodeInvalidPlatform, field: "launch.platform"},
		{name: "prepare missing reference", kind: schemas.CmdPrepareImage, mod: func(c *schemas.Command) { p := *prep; p.Reference = ""; c.PrepareImage = &p }, code: schemas.CodeMissingField, field: "prepare_image.reference"},
		{name: "prepare bad repository", kind: schemas.CmdPrepareImage, mod: func(c *schemas.Command) { p := *prep; p.Reference = "UPPER@" + testDigest; c.PrepareImage = &p }, code: schemas.CodeInvalidImage, field: "prepare_image.reference"},
		{name: "stop missing attempt id", kind: schemas.CmdStopWorkload, mod: func(c *schemas.Command) { s := *stop; s.AttemptID = ""; c.Stop = &s }, code: schemas.CodeMissingField, field: "stop.attempt_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validCommand(tc.kind)
			if tc.mod != nil {
				tc.mod(&c)
			}
			wantRefusal(t, c.Validate(), tc.code, tc.field)
		})
	}
}

func validObservation(kind schemas.ObservationKind) schemas.Observation {
	o := schemas.Observation{NodeID: "node-1", FencingToken: 2, Generation: 1, Kind: kind}
	switch kind {
	case schemas.ObsReceipt:
		o.Receipt = &schemas.OperationReceipt{OperationID: "op-1", Kind: schemas.CmdStopWorkload, Outcome: schemas.OutcomeApplied}
	case schemas.ObsWorkload:
		o.Workload = &schemas.WorkloadObservation{RunID: "r-1", AttemptID: "r-1-a1", Phase: schemas.WorkloadRunning}
	case schemas.ObsFacts:
		o.Facts = &schemas.NodeFacts{Host: schemas.HostFacts{OS: "linux", Architecture: "amd64"}}
	case schemas.ObsReconciliation:
		o.Reconciliation = &schemas.Reconciliation{NodeID: "node-1"}
	}
	return o
}

func TestObservationValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		kind  schemas.ObservationKind
		mod   func(*schemas.Observation)
		code  schemas.Code
		field string
	}{
		{name: "receipt", kind: schemas.ObsReceipt},
		{name: "workload", kind: schemas.ObsWorkload},
		{name: "facts", kind: schemas.ObsFacts},
		{name: "reconciliation", kind: schemas.ObsReconciliation},

		{name: "version 2", kind: schemas.ObsFacts, mod: func(o *schemas.Observation) { o.Version = 2 }, code: schemas.CodeUnsupportedVersion, field: "version"},
		{name: "negative version", kind: schemas.ObsFacts, mod: func(o *schemas.Observation) { o.Version = -3 }, code: schemas.CodeUnsupportedVersion, field: "version"},
		{name: "missing node id", kind: schemas.ObsFacts, mod: func(o *schemas.Observation) { o.NodeID = "" }, code: schemas.CodeMissingField, field: "node_id"},
		{name: "bad node id", kind: schemas.ObsFacts, mod: func(o *schemas.Observation) { o.NodeID = "node>" }, code: schemas.CodeMalformed, field: "node_id"},
		{name: "unknown kind", kind: "gossip", code: schemas.CodeMalformed, field: "kind"},
		{name: "empty kind", kind: "", code: schemas.CodeMalformed, field: "kind"},
		{name: "receipt missing", kind: schemas.ObsReceipt, mod: func(o *schemas.Observation) { o.Receipt = nil }, code: schemas.CodeMissingField, field: "receipt"},
		{name: "workload missing", kind: schemas.ObsWorkload, mod: func(o *schemas.Observation) { o.Workload, o.Facts = nil, &schemas.NodeFacts{} }, code: schemas.CodeMissingField, field: "workload"},
		{name: "facts missing", kind: schemas.ObsFacts, mod: func(o *schemas.Observation) { o.Facts = nil }, code: schemas.CodeMissingField, field: "facts"},
		{name: "reconciliation missing", kind: schemas.ObsReconciliation, mod: func(o *schemas.Observation) { o.Reconciliation = nil }, code: schemas.CodeMissingField, field: "reconciliation"},
		{name: "artifact progress", kind: schemas.ObsWorkload, mod: func(o *schemas.Observation) {
			o.Workload.Phase, o.Workload.Progress = schemas.WorkloadPreparing, &schemas.TransferProgress{DoneBytes: 1, TotalBytes: 2, Artifact: "llama-8b"}
		}},
		{name: "progress naming no artifact", kind: schemas.ObsWorkload, mod: func(o *schemas.Observation) {
			o.Workload.Phase, o.Workload.Progress = schemas.WorkloadPreparing, &schemas.TransferProgress{DoneBytes: 1, Artifact: "Llama 8B"}
		}, code: schemas.CodeMalformed, field: "progress.artifact"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := validObservation(tc.kind)
			if tc.mod != nil {
				tc.mod(&o)
			}
			wantRefusal(t, o.Validate(), tc.code, tc.field)
		})
	}
}

func validEnrollment() schemas.EnrollmentRequest {
	return schemas.EnrollmentRequest{
		NodeID:          "node-1",
		RentalID:        "rental-7",
		Generation:      1,
		EnrollmentToken: "bootstrap-secret",
		AgentVersion:    "0.1.0",
		Capacity:        schemas.Resources{CPUMillis: 8000, MemoryBytes: 32 << 30, GPUCount: 8},
		MaxWorkloads:    4,
		Facts:           schemas.NodeFacts{Host: schemas.HostFacts{OS: "linux", Architecture: "amd64"}},
	}
}

func TestTransferProgressWhat(t *testing.T) {
	img := schemas.TransferProgress{DoneBytes: 1 << 20, TotalBytes: 4 << 20}
	art := schemas.TransferProgress{DoneBytes: 1 << 20, Artifact: "llama-8b"}
	if img.What() != "image" || art.What() != "artifact llama-8b" || img.String() != "1.0 MiB of 4.0 MiB (25%)" || art.String() != "1.0 MiB" {
		t.Fatalf("%q %q %q %q", img.What(), img.String(), art.What(), art.String())
	}
}

func TestEnrollmentRequestValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mod   func(*schemas.EnrollmentRequest)
		code  schemas.Code
		field string
	}{
		{name: "valid"},
		{name: "no rental id", mod: func(e *schemas.EnrollmentRequest) { e.RentalID = "" }},
		{name: "no cap", mod: func(e *schemas.EnrollmentRequest) { e.MaxWorkloads = 0 }},
		{name: "capacity at limits", mod: func(e *schemas.EnrollmentRequest) {
			e.Capacity = schemas.Resources{CPUMillis: schemas.MaxCPUMillis, MemoryBytes: schemas.MaxMemoryBytes, GPUCount: schemas.MaxGPUCount}
		}},
		{name: "zero capacity", mod: func(e *schemas.EnrollmentRequest) { e.Capacity = schemas.Resources{} }},

		{name: "version 2", mod: func(e *schemas.EnrollmentRequest) { e.Version = 2 }, code: schemas.CodeUnsupportedVersion, field: "version"},
		{name: "missing node id", mod: func(e *schemas.EnrollmentRequest) { e.NodeID = "" }, code: schemas.CodeMissingField, field: "node_id"},
		{name: "bad node id", mod: func(e *schemas.EnrollmentRequest) { e.NodeID = "node 1" }, code: schemas.CodeMalformed, field: "node_id"},
		{name: "bad rental id", mod: func(e *schemas.EnrollmentRequest) { e.RentalID = "rent/al" }, code: schemas.CodeMalformed, field: "rental_id"},
		{name: "negative max workloads", mod: func(e *schemas.EnrollmentRequest) { e.MaxWorkloads = -1 }, code: schemas.CodeNegativeResource, field: "max_workloads"},
		{name: "negative cpu capacity", mod: func(e *schemas.EnrollmentRequest) { e.Capacity.CPUMillis = -1 }, code: schemas.CodeNegativeResource, field: "capacity.cpu_millis"},
		{name: "negative memory capacity", mod: func(e *schemas.EnrollmentRequest) { e.Capacity.MemoryBytes = -1 }, code: schemas.CodeNegativeResource, field: "capacity.memory_bytes"},
		{name: "too many gpus", mod: func(e *schemas.EnrollmentRequest) { e.Capacity.GPUCount = schemas.MaxGPUCount + 1 }, code: schemas.CodeResourceTooLarge, field: "capacity.gpu_count"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := validEnrollment()
			if tc.mod != nil {
				tc.mod(&e)
			}
			err := e.Validate()
			wantRefusal(t, err, tc.code, tc.field)
			if err != nil && strings.Contains(err.Error(), e.EnrollmentToken) {
				t.Errorf("refusal %q echoes the enrollment token", err)
			}
		})
	}
}

func TestPhaseTerminal(t *testing.T) {
	terminal := map[schemas.Phase]bool{
		schemas.PhaseAccepted: false, schemas.PhasePlaced: false, schemas.PhasePreparing: false,
		schemas.PhaseLaunching: false, schemas.PhaseRunning: false,
		schemas.PhaseSucceeded: true, schemas.PhaseFailed: true, schemas.PhaseCancelled: true, schemas.PhaseLost: true,
	}
	for p, want := range terminal {
		if got := p.Terminal(); got != want {
			t.Errorf("%s.Terminal() = %v, want %v", p, got, want)
		}
	}
	if got := schemas.WorkloadID("r-abc", 3); got != "r-abc-a3" {
		t.Errorf("WorkloadID = %q", got)
	}
	if err := schemas.ValidateID("id", schemas.WorkloadID(schemas.RunIDFor(schemas.DefaultTenant, "x"), 12), schemas.CodeMalformed); err != nil {
		t.Errorf("WorkloadID is not a valid id: %v", err)
	}
}

func TestNodeRecordLive(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	n := schemas.NodeRecord{State: schemas.NodeReady, LeaseExpires: now.Add(time.Second)}
	if !n.Live(now) {
		t.Error("ready node with a future lease is not live")
	}
	if n.Live(now.Add(time.Second)) {
		t.Error("node is live at its lease expiry")
	}
	n.State = schemas.NodeLost
	if n.Live(now) {
		t.Error("lost node is live")
	}
	n.State = schemas.NodeDraining
	if !n.Live(now) {
		t.Error("draining node with a lease is not live")
	}
}

// errors.Is distinguishes refusals from the same Validate by field.
func TestRefusalFieldMatching(t *testing.T) {
	e := validEnrollment()
	e.Capacity.GPUCount = -1
	err := e.Validate()
	if !errors.Is(err, &schemas.Refusal{Code: schemas.CodeNegativeResource, Field: "capacity.gpu_count"}) {
		t.Errorf("errors.Is with field failed for %v", err)
	}
	if errors.Is(err, &schemas.Refusal{Code: schemas.CodeNegativeResource, Field: "capacity.cpu_millis"}) {
		t.Errorf("errors.Is matched another field for %v", err)
	}
}
