package schemas_test

import (
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

func TestTokens(t *testing.T) {
	tok := strings.Repeat("A", 43) // 32 zero bytes
	if !schemas.TokenWellFormed(tok) || schemas.TokenWellFormed(tok[1:]) || schemas.TokenWellFormed(tok+"=") || schemas.TokenWellFormed("") {
		t.Fatal("TokenWellFormed accepts other than 32 bytes of unpadded base64url")
	}
	h := schemas.TokenHash(tok)
	if !strings.HasPrefix(h, "sha256:") || strings.Contains(h, tok) || h[len("sha256:"):] != schemas.InvitationKey(tok) || schemas.InvitationKey(tok) != schemas.ArtifactGrantKey(tok) {
		t.Fatalf("hash %q, key %q: want sha256:<the key>, never the token", h, schemas.InvitationKey(tok))
	}
}

// A rental resumed from stopped lets its node's old session enroll again
// only while the resume is under way, and only for the node it names.
func TestRentalResumes(t *testing.T) {
	node := schemas.NodeRecord{NodeID: "n1", RentalID: "r1", Generation: 2, SessionExpires: time.Now().Add(-time.Hour)}
	for _, c := range []struct {
		name string
		rt   schemas.Rental
		want uint64
	}{
		{"booting at the next generation", schemas.Rental{RentalID: "r1", NodeID: "n1", Generation: 3, State: schemas.RentalBooting}, 3},
		{"enrolling", schemas.Rental{RentalID: "r1", NodeID: "n1", Generation: 4, State: schemas.RentalEnrolling}, 4},
		{"ready", schemas.Rental{RentalID: "r1", NodeID: "n1", Generation: 3, State: schemas.RentalReady}, 0},
		{"stopped", schemas.Rental{RentalID: "r1", NodeID: "n1", Generation: 3, State: schemas.RentalStopped}, 0},
		{"the node's own generation", schemas.Rental{RentalID: "r1", NodeID: "n1", Generation: 2, State: schemas.RentalBooting}, 0},
		{"another node", schemas.Rental{RentalID: "r1", NodeID: "n2", Generation: 3, State: schemas.RentalBooting}, 0},
		{"another rental", schemas.Rental{RentalID: "r2", NodeID: "n1", Generation: 3, State: schemas.RentalBooting}, 0},
	} {
		if got := c.rt.Resumes(node); got != c.want {
			t.Errorf("%s: Resumes = %d, want %d", c.name, got, c.want)
		}
	}
}
