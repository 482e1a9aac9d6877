package secrets_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/controlplane/secrets"
	"github.com/warmfleet/warmfleet/schemas"
)

// FuzzParseKeyring is the key file as an operator may have edited it: it
// parses into keys that seal and open, or is refused with a reason that
// never quotes a key.
func FuzzParseKeyring(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		ring, err := secrets.ParseKeyring(data)
		if err != nil {
			for _, field := range strings.Fields(string(data)) {
				if len(field) >= 16 && !schemas.ValidSecretKeyID(field) && strings.Contains(err.Error(), field) {
					t.Fatalf("refusal %q quotes %q", err, field)
				}
			}
			return
		}
		ids := ring.KeyIDs()
		if len(ids) == 0 || len(ids) > secrets.MaxKeys || ids[0] != ring.SealingKeyID() {
			t.Fatalf("keys %v", ids)
		}
		for _, id := range ids {
			if !schemas.ValidSecretKeyID(id) || !ring.Has(id) {
				t.Fatalf("key id %q", id)
			}
		}
		id, sealed, err := ring.Seal("t", "n", data)
		if err != nil {
			t.Fatal(err)
		}
		if v, err := ring.Open(id, "t", "n", sealed); err != nil || !bytes.Equal(v, data) {
			t.Fatalf("round trip: %v", err)
		}
	})
}
