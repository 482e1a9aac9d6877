package connhealth

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/schemas"
)

// TestVerify: a connection is unverified until checked, failed (with the
// provider's error and when) while its check fails, and ok again once it
// passes, its error cleared.
func TestVerify(t *testing.T) {
	h := New("c1", "shadeform")
	if h.State() != schemas.ConnectionPending || h.Usable() || !Pending(h.State()) {
		t.Fatalf("new: %s", h.State())
	}
	t0 := time.Unix(1000, 0)
	h.Verify(context.Background(), func(context.Context) error { return errors.New("401 unauthorized") }, t0, zap.NewNop())
	st := h.Status()
	if st.State != schemas.ConnectionFailed || st.Error != "401 unauthorized" || !st.VerifiedAt.Equal(t0) || h.Usable() || !NotVerified(st.State) {
		t.Fatalf("failed check: %+v", st)
	}
	h.Verify(context.Background(), func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("a check runs without a deadline")
		}
		return nil
	}, t0.Add(time.Minute), zap.NewNop())
	st = h.Status()
	if st.State != schemas.ConnectionOK || st.Error != "" || st.ID != "c1" || st.Type != "shadeform" || !h.Usable() || NotVerified(st.State) || !Every(st.State) {
		t.Fatalf("passing check: %+v", st)
	}
}
