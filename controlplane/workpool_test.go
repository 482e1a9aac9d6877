package controlplane

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestKeyedPoolOrdersPerKeyAndRunsConcurrently: jobs of one key run in
// submission order, jobs of different keys overlap, and cancelling the
// context stops every worker.
func TestKeyedPoolOrdersPerKeyAndRunsConcurrently(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	type job struct {
		key string
		i   int
	}
	var (
		mu      sync.Mutex
		got     = map[string][]int{}
		running atomic.Int32
		peak    atomic.Int32
	)
	p := newKeyedPool(ctx, &wg, 8, 2, func(_ context.Context, j job) {
		n := running.Add(1)
		for {
			old := peak.Load()
			if n <= old || peak.CompareAndSwap(old, n) {
				break
			}
		}
		time.Sleep(time.Millisecond)
		running.Add(-1)
		mu.Lock()
		got[j.key] = append(got[j.key], j.i)
		mu.Unlock()
	})
	const keys, per = 16, 20
	for i := range per {
		for k := range keys {
			if !p.submit(fmt.Sprint("k", k), job{fmt.Sprint("k", k), i}) {
				t.Fatal("submit refused before cancel")
			}
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := 0
		for _, v := range got {
			n += len(v)
		}
		mu.Unlock()
		if n == keys*per {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d jobs ran", n, keys*per)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for k, v := range got {
		for i := range v {
			if v[i] != i {
				t.Fatalf("key %s ran out of order: %v", k, v)
			}
		}
	}
	if peak.Load() < 2 {
		t.Fatalf("jobs of different keys never overlapped (peak %d)", peak.Load())
	}
	cancel()
	wg.Wait() // every worker stopped
	if p.submit("k0", job{"k0", 0}) {
		// A full lane cannot take it after cancel; an empty one may, but
		// no worker runs it. Either way submit must not block.
		t.Log("submit after cancel queued the job; no worker runs it")
	}
}

// TestKeyedMutex: one key's holders exclude each other, other keys do not
// wait, and released keys are forgotten.
func TestKeyedMutex(t *testing.T) {
	var k keyedMutex
	unlockA := k.lock("a")
	acquired := make(chan struct{})
	go func() {
		u := k.lock("a")
		close(acquired)
		u()
	}()
	unlockB := k.lock("b") // does not wait for "a"
	select {
	case <-acquired:
		t.Fatal("a second holder of key a got the lock")
	case <-time.After(50 * time.Millisecond):
	}
	unlockA()
	select {
	case <-acquired:
	case <-time.After(5 * time.Second):
		t.Fatal("waiter on key a never got the lock")
	}
	unlockB()
	if n := k.size(); n != 0 {
		t.Fatalf("%d keys still held", n)
	}
}
