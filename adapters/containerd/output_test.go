package containerd

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/nodelog"
	"github.com/warmfleet/warmfleet/noderuntime"
)

// finishedOutput finishes an exited workload and returns all it wrote,
// stdout then stderr.
func finishedOutput(t *testing.T, rt *Runtime, id string) ([]byte, error) {
	t.Helper()
	if err := rt.Finish(testCtx(t), id); err != nil {
		return nil, err
	}
	if dir := rt.OutputDir(id); !nodelog.Done(dir) {
		return nil, fmt.Errorf("%s: Finish returned before the log writer was done", id)
	}
	return outputSoFar(rt, id)
}

// outputSoFar is what a workload has written by now, stdout then stderr.
func outputSoFar(rt *Runtime, id string) ([]byte, error) {
	var all []byte
	for _, s := range nodelog.Streams {
		b, err := os.ReadFile(nodelog.DataPath(rt.OutputDir(id), s))
		if err != nil && !os.IsNotExist(err) {
			return nil, err
		}
		all = append(all, b...)
	}
	return all, nil
}

func (f *fixture) testOutput(t *testing.T) {
	// Every line reaches its stream's file, none twice, in order, however
	// fast the workload writes: the shim's writer reads to the end before
	// Finish returns.
	t.Run("EveryLineOnceAfterFinish", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir() + "/out"
		f.launch(t, f.rt, noderuntime.WorkloadSpec{ID: "lines", Output: noderuntime.Output{Dir: dir},
			Command: []string{"sh", "-c", `i=0; while [ $i -lt 20000 ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); done`}})
		if st := wait(t, f.rt, "lines"); st.ExitCode != 0 {
			t.Fatalf("exit %d", st.ExitCode)
		}
		if err := f.rt.Finish(testCtx(t), "lines"); err != nil {
			t.Fatal(err)
		}
		if err := f.rt.Finish(testCtx(t), "lines"); err != nil {
			t.Fatalf("a second Finish: %v", err)
		}
		for _, s := range nodelog.Streams {
			b, _ := os.ReadFile(nodelog.DataPath(dir, s))
			lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
			if len(lines) != 20000 {
				t.Fatalf("%s holds %d lines, want 20000", s, len(lines))
			}
			for i, l := range lines {
				if want := fmt.Sprintf("%s %d", s.String()[3:], i); l != want {
					t.Fatalf("%s line %d = %q, want %q", s, i, l, want)
				}
			}
		}
		if err := f.rt.Remove(testCtx(t), "lines"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("Remove deleted the caller's output directory: %v", err)
		}
	})

	// Finish of a running workload is refused, and leaves it running.
	t.Run("FinishRefusesRunning", func(t *testing.T) {
		t.Parallel()
		f.launch(t, f.rt, noderuntime.WorkloadSpec{ID: "finish-running", Command: []string{"sleep", "60"}})
		err := f.rt.Finish(testCtx(t), "finish-running")
		requireIs(t, err, noderuntime.ErrWorkloadRunning)
		if st, _ := f.rt.Inspect(testCtx(t), "finish-running"); st.State != noderuntime.WorkloadRunning {
			t.Fatalf("after a refused Finish: %+v", st)
		}
	})

	// A flood past the rate limit is dropped at the writer, which says how
	// much with a marker; the workload itself is never slowed.
	t.Run("FloodIsLimitedAndMarked", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir() + "/out"
		f.launch(t, f.rt, noderuntime.WorkloadSpec{ID: "flood", Output: noderuntime.Output{Dir: dir, BytesPerSecond: 64 << 10, Burst: 64 << 10},
			Command: []string{"sh", "-c", `head -c 33554432 /dev/zero | tr '\0' 'x' | fold -w 1023`}})
		start := time.Now()
		if st := wait(t, f.rt, "flood"); st.ExitCode != 0 {
			t.Fatalf("exit %d", st.ExitCode)
		}
		took := time.Since(start)
		if err := f.rt.Finish(testCtx(t), "flood"); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(nodelog.DataPath(dir, nodelog.Stdout))
		// The writer keeps at most the burst plus the rate for the time the
		// workload ran, plus its markers.
		if limit := int64(64<<10) + int64(took.Seconds()+1)*(64<<10); int64(len(b)) > limit+int64(bytes.Count(b, []byte("[warmfleet:")))*200 {
			t.Fatalf("kept %d bytes in %s, past the limit's %d", len(b), took, limit)
		}
		var dropped int64
		for _, line := range strings.Split(string(b), "\n") {
			var n int64
			if _, err := fmt.Sscanf(line, "[warmfleet: %d bytes of stdout dropped", &n); err == nil {
				dropped += n
			}
		}
		kept := int64(strings.Count(string(b), "x"))
		// fold adds a newline every 1023 bytes: count the x's only.
		if kept+dropped < 32<<20 {
			t.Fatalf("kept %d + dropped %d x's, want the whole 32 MiB accounted for", kept, dropped)
		}
	})
}
