package nodelog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Stream names a workload's output stream.
type Stream int

// The two streams, in the order files and journals list them.
const (
	Stdout Stream = iota
	Stderr
)

// Streams lists both streams.
var Streams = [...]Stream{Stdout, Stderr}

func (s Stream) String() string {
	if s == Stderr {
		return "stderr"
	}
	return "stdout"
}

// An output directory holds, per stream, the bytes as the workload wrote
// them (with drop markers where the rate limit dropped some) and a times
// index; "done" appears once the writer has read both streams to their
// end; the agent adds its shipping journal and the workload's identity.
const (
	doneFile    = "done"
	journalFile = "shipped"
	metaFile    = "meta.json"
)

// DataPath is the file holding stream s's bytes in dir.
func DataPath(dir string, s Stream) string { return filepath.Join(dir, s.String()) }

func timesPath(dir string, s Stream) string { return filepath.Join(dir, s.String()+".times") }

// Done reports whether the writer has finished: every byte the workload
// wrote is in the data files.
func Done(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, doneFile))
	return err == nil
}

// markDone records that the writer has finished, atomically.
func markDone(dir string) error {
	tmp := filepath.Join(dir, doneFile+".tmp")
	if err := os.WriteFile(tmp, nil, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, doneFile))
}

// ErrNoOutput: a directory that holds no workload output.
var ErrNoOutput = errors.New("no workload output here")

// Size is how many bytes stream s holds in dir so far.
func Size(dir string, s Stream) (int64, error) {
	st, err := os.Stat(DataPath(dir, s))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("nodelog: %w", err)
	}
	return st.Size(), nil
}
