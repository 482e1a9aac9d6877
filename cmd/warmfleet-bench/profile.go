package main

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// profiler writes one CPU profile of a command's measured phase: the
// command calls start when the phase begins and stop when it ends (a CPU
// profile cannot be paused, so there is one phase per file).
type profiler struct {
	path string
	f    *os.File
	on   bool
}

func newProfiler(path string) (*profiler, error) {
	if path == "" {
		return &profiler{}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &profiler{path: path, f: f}, nil
}

// start begins profiling; a second start is a no-op.
func (p *profiler) start() error {
	if p.f == nil || p.on {
		return nil
	}
	p.on = true
	return pprof.StartCPUProfile(p.f)
}

func (p *profiler) stop() {
	if p.f == nil || !p.on {
		return
	}
	pprof.StopCPUProfile()
	p.on = false
}

func (p *profiler) close() {
	p.stop()
	if p.f != nil {
		_ = p.f.Close()
		fmt.Fprintln(os.Stderr, "warmfleet-bench: CPU profile in", p.path, "(go tool pprof -top", p.path+")")
	}
}
