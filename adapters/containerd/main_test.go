package containerd

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/warmfleet/warmfleet/nodelog"
)

// TestMain fails the package if any goroutine outlives the tests: the
// Runtime promises that Close stops everything it started. The test binary
// is also the workloads' log writer (Options.LogWriter defaults to it).
func TestMain(m *testing.M) {
	if code, ok := nodelog.WriterMain(os.Args); ok {
		os.Exit(code)
	}
	goleak.VerifyTestMain(m)
}
