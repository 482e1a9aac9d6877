package artifactstore

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// flight and copy goroutine must end with its owner.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
