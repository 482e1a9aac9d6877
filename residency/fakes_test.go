package residency

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// fakeClock is a Clock that moves only when Advance is called. gate lets a
// test make "check the fence, then act" atomic with respect to time moving
// (RLock around it; Advance takes the write lock), modelling a handler that
// finishes inside the lease margin.
type fakeClock struct {
	gate sync.RWMutex

	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	t := &fakeTimer{c: c, f: f}
	t.Reset(d)
	return t
}

// Advance moves time by d and fires every timer that came due.
func (c *fakeClock) Advance(d time.Duration) {
	c.gate.Lock()
	defer c.gate.Unlock()
	c.mu.Lock()
	c.now = c.now.Add(d)
	now := c.now
	var due []*fakeTimer
	keep := c.timers[:0]
	for _, t := range c.timers {
		if !t.at.After(now) {
			due = append(due, t)
		} else {
			keep = append(keep, t)
		}
	}
	c.timers = keep
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool { return due[i].at.Before(due[j].at) })
	for _, t := range due {
		if t.f != nil {
			t.f()
			continue
		}
		select {
		case t.ch <- now:
		default:
		}
	}
}

type fakeTimer struct {
	c  *fakeClock
	f  func()
	ch chan time.Time
	at time.Time
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	for i, x := range t.c.timers {
		if x == t {
			t.c.timers = append(t.c.timers[:i], t.c.timers[i+1:]...)
			return true
		}
	}
	return false
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	active := t.Stop()
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.at = t.c.now.Add(d)
	t.c.timers = append(t.c.timers, t)
	return active
}

// memDurable is an in-memory DurableStore with the epoch fence
// CommitCheckpoint promises.
type memDurable struct {
	mu     sync.Mutex
	states map[Key]SessionState
	epochs map[Key]ResidencyEpoch
	cps    []Checkpoint
}

func newMemDurable() *memDurable {
	return &memDurable{states: map[Key]SessionState{}, epochs: map[Key]ResidencyEpoch{}}
}

// seed gives key durable state written by compat.
func (d *memDurable) seed(key Key, compat string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.states[key] = SessionState{Exists: true, Namespace: "ns/" + key.Tenant + "/" + key.Session, CompatibilityID: compat,
		RuntimeJournal: JournalPresent, HasCheckpoint: true, CheckpointSequence: 1}
}

func (d *memDurable) set(key Key, st SessionState) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.states[key] = st
}

func (d *memDurable) LoadSessionState(_ context.Context, key Key) (SessionState, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, ok := d.states[key]
	if !ok {
		return SessionState{Namespace: "ns/" + key.Tenant + "/" + key.Session, RuntimeJournal: JournalEmpty}, nil
	}
	return st, nil
}

func (d *memDurable) CommitCheckpoint(_ context.Context, cp Checkpoint) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	key := KeyOf(cp.Key)
	if cp.Epoch < d.epochs[key] {
		return fmt.Errorf("%w: checkpoint at epoch %d < %d", ErrEpochSuperseded, cp.Epoch, d.epochs[key])
	}
	d.epochs[key] = cp.Epoch
	// Two earlier workspace checkpoints are kept, as the control plane's
	// default keeps three in all.
	prev := d.states[key]
	earlier := prev.EarlierCheckpoints
	if prev.Checkpoint != nil && cp.Content != nil {
		earlier = append([]schemas.CheckpointRef{{Sequence: prev.CheckpointSequence, Epoch: prev.CheckpointEpoch}}, earlier...)
		earlier = earlier[:min(len(earlier), 2)]
	}
	d.states[key] = SessionState{Exists: true, Namespace: cp.Namespace, CompatibilityID: cp.CompatibilityID,
		RuntimeJournal: JournalPresent, HasCheckpoint: true, CheckpointSequence: cp.Sequence,
		CheckpointEpoch: cp.Epoch, Checkpoint: cp.Content, EarlierCheckpoints: earlier}
	d.cps = append(d.cps, cp)
	return nil
}

func (d *memDurable) checkpoints() []Checkpoint {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Checkpoint(nil), d.cps...)
}

// fakeRuntime is an in-memory Runtime for tests that do not need
// containers (the property test).
type fakeRuntime struct {
	mu        sync.Mutex
	running   map[string]bool
	refuseRel bool
}

func newFakeRuntime() *fakeRuntime { return &fakeRuntime{running: map[string]bool{}} }

func (r *fakeRuntime) EnsureImage(context.Context, noderuntime.ImageSpec) (noderuntime.ImageResult, error) {
	return noderuntime.ImageResult{AlreadyPresent: true}, nil
}

func (r *fakeRuntime) Launch(_ context.Context, spec noderuntime.WorkloadSpec) (noderuntime.WorkloadStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.running[spec.ID]; ok {
		return noderuntime.WorkloadStatus{}, noderuntime.ErrWorkloadExists
	}
	r.running[spec.ID] = true
	return noderuntime.WorkloadStatus{ID: spec.ID, State: noderuntime.WorkloadRunning}, nil
}

func (r *fakeRuntime) Inspect(_ context.Context, id string) (noderuntime.WorkloadStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	on, ok := r.running[id]
	if !ok {
		return noderuntime.WorkloadStatus{}, noderuntime.ErrWorkloadNotFound
	}
	st := noderuntime.WorkloadExited
	if on {
		st = noderuntime.WorkloadRunning
	}
	return noderuntime.WorkloadStatus{ID: id, State: st}, nil
}

func (r *fakeRuntime) Stop(_ context.Context, id string, _ time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refuseRel {
		return errors.New("fake runtime refuses to stop")
	}
	if _, ok := r.running[id]; ok {
		r.running[id] = false
	}
	return nil
}

func (r *fakeRuntime) Remove(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refuseRel {
		return errors.New("fake runtime refuses to remove")
	}
	delete(r.running, id)
	return nil
}

func (r *fakeRuntime) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.running)
}
