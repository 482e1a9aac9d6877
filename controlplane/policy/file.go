package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/schemas"
)

// StatInterval is how often Current looks at the file at most: a
// scheduling pass and every submit ask for the policy, a stat each would
// cost more than a policy ever changes.
const StatInterval = time.Second

// File is the policy file (serve's --scheduling-policy-file), read again
// when it changes (another inode, size or mtime). A new file that does not
// validate, or a file gone, keeps the policy last read: the refusal is
// logged and counted (ReloadFailures), and the file is read again once it
// changes once more.
type File struct {
	path string
	log  *zap.Logger
	// now is the clock of the stat interval (tests move it).
	now func() time.Time

	snap atomic.Pointer[Snapshot]
	// nextStat is when Current may look at the file again (UnixNano).
	nextStat atomic.Int64
	failures atomic.Int64

	// mu is held by the one caller looking at the file; seen is what it
	// last read (nil while the file is gone).
	mu   sync.Mutex
	seen os.FileInfo
}

// Load reads and validates the policy file at path. A file that does not
// load is refused: the control plane does not start on a policy it
// cannot read.
func Load(path string, log *zap.Logger) (*File, error) {
	f := &File{path: path, log: log, now: time.Now}
	snap, st, err := readFile(path)
	if err != nil {
		return nil, err
	}
	f.snap.Store(snap)
	f.seen = st
	f.nextStat.Store(f.now().Add(StatInterval).UnixNano())
	return f, nil
}

// Current is the policy as last read, read again first when the file
// changed since it was last looked at (at most once per StatInterval).
// The Snapshot is shared: callers must not change it.
func (f *File) Current() *Snapshot {
	now := f.now()
	if now.UnixNano() < f.nextStat.Load() || !f.mu.TryLock() {
		// Another caller is looking at the file: the policy as it stands
		// is as current as this call needs.
		return f.snap.Load()
	}
	defer f.mu.Unlock()
	f.nextStat.Store(now.Add(StatInterval).UnixNano())
	f.check()
	return f.snap.Load()
}

// ReloadFailures counts changed files that did not load (refused,
// unreadable, gone), each once until the file changes again.
func (f *File) ReloadFailures() int64 { return f.failures.Load() }

// check reads the file again when it changed; f.mu is held. A failure
// is reported once: a file gone or unreadable until it is back, a bad file
// until it changes.
func (f *File) check() {
	st, err := os.Stat(f.path)
	if err == nil && f.seen != nil && os.SameFile(st, f.seen) && st.Size() == f.seen.Size() && st.ModTime().Equal(f.seen.ModTime()) {
		return
	}
	old := f.snap.Load()
	if err != nil {
		if f.seen != nil {
			f.failures.Add(1)
			f.log.Warn("scheduling policy file unreadable; keeping the policy last read", zap.String("path", f.path),
				zap.String("version", old.Version), zap.Error(err))
		}
		f.seen = nil
		return
	}
	snap, read, err := readFile(f.path)
	if read != nil {
		st = read
	}
	f.seen = st // not read again until it changes once more
	if err != nil {
		f.failures.Add(1)
		fields := []zap.Field{zap.String("path", f.path), zap.String("version", old.Version), zap.Error(err)}
		var r *schemas.Refusal
		if errors.As(err, &r) {
			fields = append(fields, zap.String("code", string(r.Code)), zap.String("field", r.Field), zap.String("reason", r.Reason))
		}
		f.log.Warn("scheduling policy file changed but does not load; keeping the policy last read", fields...)
		return
	}
	if snap.Version == old.Version {
		return // touched, or rewritten with the same bytes
	}
	f.snap.Store(snap)
	f.log.Info("scheduling policy read again", zap.String("path", f.path), zap.String("version", snap.Version),
		zap.String("previous", old.Version), zap.Int("priority_classes", len(snap.PriorityClasses)), zap.Int("tenants", len(snap.Tenants)))
}

// Read reads and validates the policy file at path once, as Load and
// every reload do: `policy check` and serve's check before it starts.
func Read(path string) (*Snapshot, error) {
	snap, _, err := readFile(path)
	return snap, err
}

// readFile reads and validates path; st is what was read (non-nil when
// the file could be opened, even if it did not load).
func readFile(path string) (*Snapshot, os.FileInfo, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("scheduling policy: %w", err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("scheduling policy: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, st, fmt.Errorf("scheduling policy: %s is not a regular file", path)
	}
	data, err := io.ReadAll(io.LimitReader(fh, schemas.MaxPolicyBytes+1))
	if err != nil {
		return nil, st, fmt.Errorf("scheduling policy: %w", err)
	}
	p, err := schemas.ParseSchedulingPolicy(data)
	if err != nil {
		return nil, st, fmt.Errorf("scheduling policy %s: %w", path, err)
	}
	return Static(p, Version(data)), st, nil
}

// Version is a policy file's version: the sha256 of its bytes.
func Version(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
