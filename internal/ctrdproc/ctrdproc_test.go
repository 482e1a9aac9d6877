package ctrdproc_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/internal/ctrdproc"
)

func requireContainerd(t *testing.T) {
	t.Helper()
	if err := ctrdproc.Check(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, refusing to skip: %v", err)
		}
		t.Skip(err)
	}
}

// TestDaemon_DeepDirRestart: a daemon in a directory too deep for a unix
// socket gets a private short socket dir; Stop keeps Dir and removes that
// socket dir; a second daemon starts from the same Dir.
func TestDaemon_DeepDirRestart(t *testing.T) {
	requireContainerd(t)
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 2 {
		d, err := ctrdproc.Start(ctx, ctrdproc.Config{Dir: dir, Log: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(d.Address, dir) || len(d.Address) > 100 {
			t.Fatalf("socket %s in a deep dir", d.Address)
		}
		if err := d.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if err := d.Stop(ctx); err != nil {
			t.Fatalf("second stop: %v", err)
		}
		if _, err := os.Stat(filepath.Dir(d.Address)); !os.IsNotExist(err) {
			t.Fatalf("run %d: socket dir remains: %v", i, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "root")); err != nil {
			t.Fatalf("run %d: root gone: %v", i, err)
		}
	}
}
