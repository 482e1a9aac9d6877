package containerd

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests: the
// Runtime promises that Close stops everything it started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
