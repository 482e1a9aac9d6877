// Package cdispec reads the host's Container Device Interface specs with
// tags.cncf.io/container-device-interface, the library containerd's CRI
// plugin uses: Scan reports what they offer as schemas.CDIFacts (the
// agent's facts, adapters/gpuprobe), and Inject resolves fully qualified
// device names against them and applies their edits (device nodes, env,
// mounts, hooks) to an OCI spec (adapters/containerd). containerd's client
// has no CDI helper of its own (/work/shared/DESIGN.md, "Facts checked").
//
// Every call rescans the spec directories, so a spec written after start
// (nvidia-ctk cdi generate, a driver upgrade) is seen at the next Launch or
// report; there is no watcher goroutine to stop. A malformed spec file is
// reported and skipped; the others still resolve.
package cdispec

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"go.uber.org/zap"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/warmfleet/warmfleet/schemas"
)

// The spec directories CDI defines: static specs, and generated ones (what
// nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml writes). A
// device declared in both is taken from the later.
const (
	StaticDir  = "/etc/cdi"
	DynamicDir = "/var/run/cdi"
)

// DefaultDirs are the directories read when none are configured.
func DefaultDirs() []string { return []string{StaticDir, DynamicDir} }

// maxReason bounds an error reason in facts.
const maxReason = 240

var (
	// ErrInvalidName: a device name that is not fully qualified
	// (vendor/class=name).
	ErrInvalidName = errors.New("invalid CDI device name")
	// ErrUnresolvable: a device no valid spec declares.
	ErrUnresolvable = errors.New("unresolvable CDI device")
	// ErrInject: the specs declare the devices but their edits could not
	// be applied (e.g. a device node missing on the host).
	ErrInject = errors.New("CDI injection failed")
)

// UnresolvedError names the devices no valid spec declares, with the spec
// files that could not be read (one of them may have declared it).
type UnresolvedError struct {
	Devices    []string
	Dirs       []string
	SpecErrors []schemas.CDISpecError
}

func (e *UnresolvedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: no valid CDI spec in %s declares it", ErrUnresolvable, strings.Join(e.Devices, ", "), strings.Join(e.Dirs, ", "))
	for _, se := range e.SpecErrors {
		fmt.Fprintf(&b, "; %s: %s", se.Path, se.Reason)
	}
	return b.String()
}

func (e *UnresolvedError) Is(target error) bool { return target == ErrUnresolvable }

// Registry is the CDI specs in a set of directories. Safe for concurrent
// use.
type Registry struct {
	dirs []string
	log  *zap.Logger

	mu    sync.Mutex // serialises a refresh with the reads after it
	cache *cdi.Cache
	// logged is the spec errors last logged at warn: the same ones are
	// not repeated at every report and launch.
	logged string
}

// New reads specs from dirs (DefaultDirs when empty), lowest priority
// first. Nothing is read until the first Scan or Inject.
func New(dirs []string, log *zap.Logger) *Registry {
	if len(dirs) == 0 {
		dirs = DefaultDirs()
	}
	dirs = slices.Clone(dirs)
	for i, d := range dirs {
		dirs[i] = filepath.Clean(d)
	}
	if log == nil {
		log = zap.NewNop()
	}
	// Manual refresh: the library's auto-refresh runs an fsnotify
	// goroutine nothing here could stop.
	cache, _ := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false)) // its error is always nil
	return &Registry{dirs: dirs, log: log.With(zap.String("cdi", "registry")), cache: cache}
}

// Dirs are the spec directories, lowest priority first.
func (r *Registry) Dirs() []string { return slices.Clone(r.dirs) }

// refresh rescans the directories and returns the files and directories
// that could not be used. r.mu is held.
func (r *Registry) refresh() []schemas.CDISpecError {
	_ = r.cache.Refresh() // per-file errors are read back below
	var out []schemas.CDISpecError
	for _, d := range r.dirs {
		// The library skips a directory it cannot walk without a word; a
		// missing one is simply empty.
		if _, err := os.ReadDir(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			out = append(out, schemas.CDISpecError{Path: d, Reason: shortReason(d, err)})
		}
	}
	for path, errs := range r.cache.GetErrors() {
		for _, err := range errs {
			out = append(out, schemas.CDISpecError{Path: path, Reason: shortReason(path, err)})
		}
	}
	slices.SortFunc(out, func(a, b schemas.CDISpecError) int {
		if c := strings.Compare(a.Path, b.Path); c != 0 {
			return c
		}
		return strings.Compare(a.Reason, b.Reason)
	})
	var key strings.Builder
	for _, e := range out {
		key.WriteString(e.Path + "\x00" + e.Reason + "\x00")
	}
	level := zap.DebugLevel
	if key.String() != r.logged {
		level, r.logged = zap.WarnLevel, key.String()
	}
	for _, e := range out {
		r.log.Log(level, "CDI spec not usable; its devices are not offered", zap.String("path", e.Path), zap.String("reason", e.Reason))
	}
	return out
}

// Scan rereads the specs and states what they offer.
func (r *Registry) Scan() schemas.CDIFacts {
	r.mu.Lock()
	defer r.mu.Unlock()
	errs := r.refresh()
	devices := r.cache.ListDevices() // sorted
	return schemas.CDIFacts{Scanned: true, SpecDirs: slices.Clone(r.dirs), Devices: devices, Errors: errs}
}

// Inject rereads the specs, resolves every device (fully qualified names,
// e.g. "nvidia.com/gpu=0") and applies the edits of their specs and of
// each device to spec. Nothing is applied unless every device resolves:
// an invalid name is ErrInvalidName, one no valid spec declares an
// *UnresolvedError (ErrUnresolvable), edits that fail ErrInject.
func (r *Registry) Inject(spec *specs.Spec, devices []string) error {
	if len(devices) == 0 {
		return nil
	}
	for _, d := range devices {
		if _, _, _, err := parser.ParseQualifiedName(d); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidName, err)
		}
	}
	if spec == nil {
		return fmt.Errorf("%w: no OCI spec", ErrInject)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	errs := r.refresh()
	var unresolved []string
	for _, d := range devices {
		if r.cache.GetDevice(d) == nil {
			unresolved = append(unresolved, d)
		}
	}
	if len(unresolved) > 0 {
		return &UnresolvedError{Devices: unresolved, Dirs: slices.Clone(r.dirs), SpecErrors: errs}
	}
	// InjectDevices edits in place and may fail half way (a host device
	// node gone): apply to a copy, so a failure leaves spec as it was.
	work, err := deepCopy(spec)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInject, err)
	}
	if unresolved, err := r.cache.InjectDevices(work, devices...); err != nil {
		if len(unresolved) > 0 { // removed between the check and now
			return &UnresolvedError{Devices: unresolved, Dirs: slices.Clone(r.dirs), SpecErrors: errs}
		}
		return fmt.Errorf("%w: %s: %w", ErrInject, strings.Join(devices, ", "), err)
	}
	*spec = *work
	return nil
}

// shortReason is err's text without the path it repeats, cut to maxReason.
func shortReason(path string, err error) string {
	s := err.Error()
	for _, p := range []string{`"` + path + `"`, path} {
		s = strings.ReplaceAll(s, p, "")
	}
	s = strings.Join(strings.Fields(s), " ")
	s = strings.ReplaceAll(s, "failed to load CDI Spec failed to", "failed to")
	s = strings.ReplaceAll(s, " :", ":")
	if len(s) > maxReason {
		s = s[:maxReason] + "…"
	}
	return s
}

// deepCopy copies an OCI spec through its JSON form.
func deepCopy(s *specs.Spec) (*specs.Spec, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("copy OCI spec: %w", err)
	}
	var out specs.Spec
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("copy OCI spec: %w", err)
	}
	return &out, nil
}
