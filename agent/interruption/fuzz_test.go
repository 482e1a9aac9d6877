package interruption

import (
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/warmfleet/warmfleet/schemas"
)

// FuzzNotice: whatever a provider's metadata endpoint or notice file
// holds, the agent reads it into a notice its control plane accepts on a
// heartbeat (valid UTF-8, bounded) and that survives the wire.
func FuzzNotice(f *testing.F) {
	f.Add([]byte(`{"action": "terminate", "time": "2030-01-02T03:04:05Z"}`))
	f.Add([]byte("2030-01-02T03:04:05Z\nreclaiming\n"))
	f.Add([]byte("TRUE"))
	f.Add([]byte("\xff\xfe\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, source := range []string{"file", "url"} {
			n := notice(source, b)
			if err := n.Validate(); err != nil {
				t.Fatalf("notice of %q refused: %v", b, err)
			}
			if !utf8.ValidString(n.Detail) {
				t.Fatalf("detail %q is not UTF-8", n.Detail)
			}
			raw, err := json.Marshal(n)
			if err != nil {
				t.Fatal(err)
			}
			var back schemas.InterruptionNotice
			if err := json.Unmarshal(raw, &back); err != nil || back.Detail != n.Detail || !back.At.Equal(n.At) {
				t.Fatalf("round trip of %+v: %+v, %v", n, back, err)
			}
		}
	})
}
