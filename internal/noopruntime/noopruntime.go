// Package noopruntime is a noderuntime.Runtime that runs nothing: it keeps
// images and workloads as records in memory. Benchmarks use it to time the
// control plane and the agent without a container runtime in the way; the
// optional delays stand in for an image pull or a container start. A
// workload's own environment may say how it ends (behaviour.go), so one
// fleet's Runs can differ.
package noopruntime

import (
	"context"
	"runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// Options tunes the runtime. Zero values mean "instant" and "runs until
// stopped".
type Options struct {
	// PullDelay is how long EnsureImage takes for an image not yet held.
	PullDelay time.Duration
	// PullBytes, when set, is the size such an image claims: EnsureImage
	// reports its progress in ten steps across PullDelay.
	PullBytes int64
	// LaunchDelay is how long Launch takes.
	LaunchDelay time.Duration
	// ExitAfter ends every workload with exit code 0 this long after it
	// started, unless its environment says otherwise (EnvExitAfter and the
	// others); 0 keeps workloads running until they are stopped.
	ExitAfter time.Duration
	// Images are held from the start (manifest digests, "sha256:<hex>").
	Images []string
	// Now is the runtime's clock; time.Now when nil.
	Now func() time.Time
}

// Runtime is the in-memory runtime. It is safe for concurrent use.
type Runtime struct {
	opts Options

	mu        sync.Mutex
	images    map[string]time.Time // digest → when it was last ensured or launched
	workloads map[string]*workload
	ensures   int
	launches  int
}

type workload struct {
	st    noderuntime.WorkloadStatus
	done  chan struct{} // closed when the workload exits
	timer *time.Timer
}

var _ noderuntime.Runtime = (*Runtime)(nil)

// New returns a runtime holding opts.Images.
func New(opts Options) *Runtime {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	r := &Runtime{opts: opts, images: map[string]time.Time{}, workloads: map[string]*workload{}}
	for _, d := range opts.Images {
		r.images[d] = opts.Now()
	}
	return r
}

// Counts reports how many EnsureImage and Launch calls changed something.
func (r *Runtime) Counts() (ensures, launches int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ensures, r.launches
}

// Info names the runtime.
func (r *Runtime) Info(context.Context) (noderuntime.RuntimeInfo, error) {
	return noderuntime.RuntimeInfo{Name: "noop", Version: runtime.Version(), ExactImageInventory: true, BindMounts: true}, nil
}

// EnsureImage marks the image present, after PullDelay when it was not.
func (r *Runtime) EnsureImage(ctx context.Context, spec noderuntime.ImageSpec) (noderuntime.ImageResult, error) {
	r.mu.Lock()
	_, ok := r.images[spec.ManifestDigest]
	if ok {
		r.images[spec.ManifestDigest] = r.opts.Now()
	}
	r.mu.Unlock()
	if ok {
		return noderuntime.ImageResult{AlreadyPresent: true, Source: "local"}, nil
	}
	if r.opts.PullBytes > 0 && spec.Progress != nil {
		const steps = 10
		for i := int64(1); i <= steps; i++ {
			if err := sleep(ctx, r.opts.PullDelay/steps); err != nil {
				return noderuntime.ImageResult{}, err
			}
			spec.Progress(r.opts.PullBytes*i/steps, r.opts.PullBytes)
		}
	} else if err := sleep(ctx, r.opts.PullDelay); err != nil {
		return noderuntime.ImageResult{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.images[spec.ManifestDigest]; ok {
		return noderuntime.ImageResult{AlreadyPresent: true, Source: "local"}, nil
	}
	r.images[spec.ManifestDigest] = r.opts.Now()
	r.ensures++
	return noderuntime.ImageResult{Source: "noop"}, nil
}

// Launch records a running workload, after LaunchDelay.
func (r *Runtime) Launch(ctx context.Context, spec noderuntime.WorkloadSpec) (noderuntime.WorkloadStatus, error) {
	r.mu.Lock()
	_, exists := r.workloads[spec.ID]
	r.mu.Unlock()
	if exists {
		return noderuntime.WorkloadStatus{}, noderuntime.ErrWorkloadExists
	}
	b, err := behaviourOf(spec.Env)
	if err != nil {
		return noderuntime.WorkloadStatus{}, err
	}
	if err := sleep(ctx, r.opts.LaunchDelay); err != nil {
		return noderuntime.WorkloadStatus{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.workloads[spec.ID]; ok {
		return noderuntime.WorkloadStatus{}, noderuntime.ErrWorkloadExists
	}
	labels := make(map[string]string, len(spec.Labels))
	for k, v := range spec.Labels {
		labels[k] = v
	}
	if _, ok := r.images[spec.ManifestDigest]; ok {
		r.images[spec.ManifestDigest] = r.opts.Now()
	}
	w := &workload{
		st: noderuntime.WorkloadStatus{ID: spec.ID, State: noderuntime.WorkloadRunning, Labels: labels, StartedAt: r.opts.Now(),
			Devices: slices.Clone(spec.Devices), ManifestDigest: spec.ManifestDigest},
		done: make(chan struct{}),
	}
	r.workloads[spec.ID] = w
	r.launches++
	if after, ok := b.exitAfter(r.opts.ExitAfter); ok {
		w.timer = time.AfterFunc(after, func() { r.exit(spec.ID, b.code, b.oom) })
	}
	return copyStatus(w.st), nil
}

// exit ends a running workload with code, as an OOM kill when oom.
func (r *Runtime) exit(id string, code int, oom bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w, ok := r.workloads[id]
	if !ok || w.st.State == noderuntime.WorkloadExited {
		return
	}
	if w.timer != nil {
		w.timer.Stop()
	}
	w.st.State, w.st.ExitCode, w.st.OOMKilled, w.st.FinishedAt = noderuntime.WorkloadExited, code, oom, r.opts.Now()
	close(w.done)
}

// Wait blocks until the workload exits or ctx ends.
func (r *Runtime) Wait(ctx context.Context, id string) (noderuntime.WorkloadStatus, error) {
	r.mu.Lock()
	w, ok := r.workloads[id]
	r.mu.Unlock()
	if !ok {
		return noderuntime.WorkloadStatus{}, noderuntime.ErrWorkloadNotFound
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		return noderuntime.WorkloadStatus{}, ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return copyStatus(w.st), nil
}

// Inspect returns the workload's status.
func (r *Runtime) Inspect(_ context.Context, id string) (noderuntime.WorkloadStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w, ok := r.workloads[id]
	if !ok {
		return noderuntime.WorkloadStatus{}, noderuntime.ErrWorkloadNotFound
	}
	return copyStatus(w.st), nil
}

// Stop ends the workload at once with 143 (SIGTERM); the grace is not
// waited, since nothing runs. Stopping an exited workload is not an error.
func (r *Runtime) Stop(_ context.Context, id string, _ time.Duration) error {
	r.mu.Lock()
	_, ok := r.workloads[id]
	r.mu.Unlock()
	if !ok {
		return noderuntime.ErrWorkloadNotFound
	}
	r.exit(id, 143, false)
	return nil
}

// Finish has nothing to complete: a workload here writes no output.
func (r *Runtime) Finish(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	w, ok := r.workloads[id]
	switch {
	case !ok:
		return noderuntime.ErrWorkloadNotFound
	case w.st.State != noderuntime.WorkloadExited:
		return noderuntime.ErrWorkloadRunning
	}
	return nil
}

// Remove forgets the workload.
func (r *Runtime) Remove(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	w, ok := r.workloads[id]
	if !ok {
		return noderuntime.ErrWorkloadNotFound
	}
	if w.timer != nil {
		w.timer.Stop()
	}
	if w.st.State != noderuntime.WorkloadExited {
		w.st.State = noderuntime.WorkloadExited
		close(w.done)
	}
	delete(r.workloads, id)
	return nil
}

// List returns every workload, by id.
func (r *Runtime) List(context.Context) ([]noderuntime.WorkloadStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]noderuntime.WorkloadStatus, 0, len(r.workloads))
	for _, w := range r.workloads {
		out = append(out, copyStatus(w.st))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Images reports every held image as hot, on this machine's platform.
func (r *Runtime) Images(context.Context) ([]schemas.ImageLocality, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]schemas.ImageLocality, 0, len(r.images))
	for d, at := range r.images {
		out = append(out, schemas.ImageLocality{
			ManifestDigest: d, Platform: schemas.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH},
			ContentPresent: true, State: schemas.LocalityHot, LastVerifiedAt: at,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ManifestDigest < out[j].ManifestDigest })
	return out, nil
}

// ImageUsage reports every held image as taking no disk (nothing is
// stored), last used at its last EnsureImage or Launch.
func (r *Runtime) ImageUsage(context.Context) ([]noderuntime.ImageUse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]noderuntime.ImageUse, 0, len(r.images))
	for d, at := range r.images {
		out = append(out, noderuntime.ImageUse{ManifestDigest: d, LastUsedAt: at})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ManifestDigest < out[j].ManifestDigest })
	return out, nil
}

// RemoveImage forgets the image; forgetting one not held is not an error.
func (r *Runtime) RemoveImage(_ context.Context, manifestDigest string) (noderuntime.RemovedImage, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.images, manifestDigest)
	return noderuntime.RemovedImage{}, nil
}

func copyStatus(st noderuntime.WorkloadStatus) noderuntime.WorkloadStatus {
	labels := make(map[string]string, len(st.Labels))
	for k, v := range st.Labels {
		labels[k] = v
	}
	st.Labels = labels
	st.Devices = slices.Clone(st.Devices)
	return st
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
