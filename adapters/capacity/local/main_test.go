package local_test

import (
	"os"
	"testing"

	"github.com/warmfleet/warmfleet/nodelog"
)

// TestMain lets the test binary serve as the workloads' log writer, which
// containerd's shim runs (containerd.Options.LogWriter defaults to it).
func TestMain(m *testing.M) {
	if code, ok := nodelog.WriterMain(os.Args); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}
