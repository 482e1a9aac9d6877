package nodehost

import (
	"encoding/json"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

// FuzzSessionCommandDecode: whatever body arrives on a node's session
// subject, the host's decoder never panics; a command it accepts came in
// strict JSON within the message limit, with every field within the limits
// on node messages, and encodes back to a command that decodes the same.
// Seeds are in testdata/fuzz/FuzzSessionCommandDecode.
func FuzzSessionCommandDecode(f *testing.F) {
	for _, c := range []schemas.SessionCommand{
		{FencingToken: 4, Tenant: "acme", Session: "s-1", Mode: "create", CompatibilityID: "busybox@1", Actor: "ops", Trace: "t-1",
			GPUs: []string{"GPU-aaaa"}, Devices: []string{"nvidia.com/gpu=0"}},
		{FencingToken: 4},
	} {
		b, err := json.Marshal(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"fencing_token":1,"tenant":"acme","extra":true}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		cmd, err := DecodeCommand(body)
		if err != nil {
			return
		}
		if len(body) > schemas.MaxNodeMessageBytes {
			t.Fatalf("a command of %d bytes was decoded", len(body))
		}
		if err := schemas.CheckNodeSizes("", &cmd); err != nil {
			t.Fatalf("accepted command past a limit: %v", err)
		}
		b, err := json.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeCommand(b)
		if err != nil || again.Key() != cmd.Key() || again.FencingToken != cmd.FencingToken || len(again.GPUs) != len(cmd.GPUs) {
			t.Fatalf("an accepted command does not survive a round trip: %+v → %+v, %v", cmd, again, err)
		}
	})
}

// TestDecodeCommand_Strict: an unknown field, a body past the message
// limit and a field past its limit are refused.
func TestDecodeCommand_Strict(t *testing.T) {
	big := make([]byte, schemas.MaxNodeMessageBytes+1)
	for i := range big {
		big[i] = ' '
	}
	many, _ := json.Marshal(schemas.SessionCommand{FencingToken: 1, GPUs: make([]string, schemas.MaxGPUCount+1)})
	for name, body := range map[string][]byte{
		"unknown field": []byte(`{"fencing_token":1,"colour":"red"}`),
		"oversized":     big,
		"too many gpus": many,
		"trailing data": []byte(`{"fencing_token":1}{}`),
	} {
		if _, err := DecodeCommand(body); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := DecodeCommand([]byte(`{"fencing_token":1,"tenant":"acme","session":"s"}`)); err != nil {
		t.Errorf("a plain command: %v", err)
	}
}
