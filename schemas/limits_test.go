package schemas

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// TestCheckNodeSizes: every kind of node message refuses an oversized
// string, slice or map, coded, naming the field's wire path and the limit;
// the table's entries override the defaults; a message at its limits
// passes.
func TestCheckNodeSizes(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	ids := func(n int) []string { return make([]string, n) }
	for _, c := range []struct {
		name  string
		v     interface{ Validate() error }
		code  Code
		field string
	}{
		{"receipt message", &Observation{NodeID: "n", Kind: ObsReceipt, Receipt: &OperationReceipt{OperationID: "o", Message: long(MaxStringBytes + 1)}},
			CodeValueTooLong, "receipt.message"},
		{"receipt run id past the default", &Observation{NodeID: "n", Kind: ObsReceipt, Receipt: &OperationReceipt{RunID: long(DefaultNodeStringBytes + 1)}},
			CodeValueTooLong, "receipt.run_id"},
		{"workload gpus", &Observation{NodeID: "n", Kind: ObsWorkload, Workload: &WorkloadObservation{RunID: "r", AttemptID: "a", GPUs: ids(MaxGPUCount + 1)}},
			CodeTooManyItems, "workload.gpus"},
		{"facts layer digest", &Observation{NodeID: "n", Kind: ObsFacts, Facts: &NodeFacts{Images: []ImageLocality{{}, {LayerDigests: []string{long(DefaultNodeStringBytes + 1)}}}}},
			CodeValueTooLong, "facts.images[1].layer_digests[0]"},
		{"facts cdi errors", &Observation{NodeID: "n", Kind: ObsFacts, Facts: &NodeFacts{Host: HostFacts{Accelerator: AcceleratorFacts{CDI: CDIFacts{Errors: make([]CDISpecError, DefaultNodeItems+1)}}}}},
			CodeTooManyItems, "facts.host.accelerator.cdi.errors"},
		{"reconciliation applied ids", &Observation{NodeID: "n", Kind: ObsReconciliation, Reconciliation: &Reconciliation{AppliedOperationIDs: ids(2*4096 + 1)}},
			CodeTooManyItems, "reconciliation.applied_operation_ids"},
		{"prefetch progress", &Observation{NodeID: "n", Kind: ObsImageProgress, ImageProgress: &ImageProgress{OperationID: "o", PrefetchID: "p", ManifestDigest: long(2000)}},
			CodeValueTooLong, "image_progress.manifest_digest"},
		{"renewal token", &SessionRenewal{NodeID: "n", SessionToken: long(257)}, CodeValueTooLong, "session_token"},
		{"heartbeat node id", &Heartbeat{NodeID: long(200)}, CodeMalformed, "node_id"},
		{"enrollment agent version", &EnrollmentRequest{NodeID: "n", AgentVersion: long(DefaultNodeStringBytes + 1)}, CodeValueTooLong, "agent_version"},
		{"enrollment network modes", &EnrollmentRequest{NodeID: "n", Facts: NodeFacts{Host: HostFacts{NetworkModes: ids(DefaultNodeItems + 1)}}}, CodeTooManyItems, "facts.host.network_modes"},
		{"residency lease token", &ResidencyKeyRequest{Key: SessionKey{Tenant: "t", Session: "s"}, Token: long(DefaultNodeStringBytes + 1)}, CodeValueTooLong, "token"},
		{"residency grant holder", &SessionLeaseGrant{Holder: long(DefaultNodeStringBytes + 1)}, CodeValueTooLong, "holder"},
		{"residency route gpus", &ResidencyObservation{GPUs: ids(MaxGPUCount + 1)}, CodeTooManyItems, "gpus"},
		{"residency tombstone key", &ResidencyTombstoneRequest{Key: SessionKey{Tenant: long(DefaultNodeStringBytes + 1)}}, CodeValueTooLong, "key.tenant"},
		{"checkpoint namespace", &SessionCheckpoint{Namespace: long(DefaultNodeStringBytes + 1)}, CodeValueTooLong, "Namespace"},
		{"session reply residencies", &SessionReply{Residencies: make([]ResidencyView, MaxKeepItems+1)}, CodeTooManyItems, "residencies"},
		{"session reply error", &SessionReply{Error: &SessionError{Message: long(MaxStringBytes + 1)}}, CodeValueTooLong, "error.message"},
		{"session command devices", &SessionCommand{Devices: ids(1025)}, CodeTooManyItems, "devices"},
		{"prune report", &PruneReport{NodeID: "n", Failed: []DiskItem{{Reason: long(MaxStringBytes + 1)}}}, CodeValueTooLong, "failed[0].reason"},
	} {
		err := c.v.Validate()
		var r *Refusal
		if !errors.As(err, &r) || r.Code != c.code || r.Field != c.field {
			t.Errorf("%s: %v, want %s on %q", c.name, err, c.code, c.field)
			continue
		}
		if c.code != CodeMalformed && !strings.Contains(r.Reason, "the limit is") {
			t.Errorf("%s: reason %q does not name the limit", c.name, r.Reason)
		}
	}

	now := time.Now()
	full := &Observation{NodeID: "n", Kind: ObsReconciliation, Reconciliation: &Reconciliation{NodeID: "n",
		AppliedOperationIDs: ids(4096), Workloads: []WorkloadObservation{{RunID: "r", AttemptID: "a", ObservedAt: now, FailureReason: long(MaxStringBytes), GPUs: ids(8)}},
		Facts: NodeFacts{ObservedAt: now, Images: make([]ImageLocality, 200)}}}
	if err := full.Validate(); err != nil {
		t.Errorf("a reconciliation within every limit: %v", err)
	}
	if err := CheckNodeMessageSize(MaxNodeMessageBytes); err != nil {
		t.Errorf("a message at the limit: %v", err)
	}
	if err := CheckNodeMessageSize(MaxNodeMessageBytes + 1); !errors.Is(err, &Refusal{Code: CodePayloadTooLarge}) {
		t.Errorf("a message past the limit: %v", err)
	}
}

// TestTruncateText: text at the limit is kept; longer text is cut at a
// rune boundary to at most the limit, marked with what was cut.
func TestTruncateText(t *testing.T) {
	if got := TruncateText("short", 10); got != "short" {
		t.Errorf("short text changed: %q", got)
	}
	for _, s := range []string{strings.Repeat("a", 5000), strings.Repeat("é", 3000), strings.Repeat("日本", 1000)} {
		got := TruncateText(s, MaxReceiptMessageBytes)
		if len(got) > MaxReceiptMessageBytes || !utf8.ValidString(got) || !strings.Contains(got, " bytes cut]") {
			t.Errorf("cut of %d bytes: %d bytes, valid %v: ...%q", len(s), len(got), utf8.ValidString(got), got[max(0, len(got)-40):])
		}
		if !strings.HasPrefix(s, strings.SplitN(got, "…", 2)[0]) {
			t.Errorf("the cut is not a prefix")
		}
	}
	if got := TruncateText(strings.Repeat("a", 100), 10); got != strings.Repeat("a", 10) {
		t.Errorf("a limit too small for the marker: %q", got)
	}
}
