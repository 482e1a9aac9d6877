package main

import (
	"sync"
	"time"
)

// imageRecorder is the agent's ImageMetrics in the bench: every credential
// ask and every fetch, in order.
type imageRecorder struct {
	mu          sync.Mutex
	credentials []time.Duration
	failedAsks  int
	fetches     []time.Duration
}

func (r *imageRecorder) CredentialAsked(d time.Duration, answered bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !answered {
		r.failedAsks++
		return
	}
	r.credentials = append(r.credentials, d)
}

func (r *imageRecorder) ImageFetched(source string, _ int64, d time.Duration) {
	if source != "registry" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fetches = append(r.fetches, d)
}

func (r *imageRecorder) snapshot() (creds, fetches []time.Duration, failed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.credentials...), append([]time.Duration(nil), r.fetches...), r.failedAsks
}
