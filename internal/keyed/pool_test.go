package keyed_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/keyed"
)

// TestPoolOrdersPerKeyAndRunsConcurrently: jobs of one key run in
// submission order, jobs of different keys overlap, at most Workers at
// once, and cancelling the context stops every goroutine.
func TestPoolOrdersPerKeyAndRunsConcurrently(t *testing.T) {
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
	const workers = 8
	p := keyed.NewPool(ctx, &wg, keyed.PoolOptions{Workers: workers, Queue: workers * 2}, func(_ context.Context, j job) {
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
			if !p.Submit(fmt.Sprint("k", k), job{fmt.Sprint("k", k), i}) {
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
	if peak.Load() > workers {
		t.Fatalf("%d jobs ran at once, limit %d", peak.Load(), workers)
	}
	cancel()
	wg.Wait() // every goroutine stopped
	if p.Submit("k0", job{"k0", 0}) {
		t.Fatal("submit after cancel queued the job")
	}
}

// TestPoolAppliesEverythingInOrder: with no bounds, every submitted job
// runs, those of one key in submission order. The race it guards: a key's
// goroutine finding its queue empty and exiting just as a Submit for that
// key hands over its job, which then waited unread until the command's
// AckWait redelivered it (seen as a 30 s stall in `warmfleet-bench rtt`).
func TestPoolAppliesEverythingInOrder(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })

	type item struct {
		key string
		n   int
	}
	var (
		mu      sync.Mutex
		last    = map[string]int{}
		applied int
		order   []string
	)
	done := make(chan struct{})
	const keys, perKey, singles = 8, 200, 20000
	total := keys*perKey + singles
	p := keyed.NewPool(ctx, &wg, keyed.PoolOptions{}, func(_ context.Context, it item) {
		mu.Lock()
		defer mu.Unlock()
		if prev, ok := last[it.key]; ok && it.n != prev+1 {
			order = append(order, fmt.Sprintf("%s: %d after %d", it.key, it.n, prev))
		}
		last[it.key] = it.n
		applied++
		if applied == total {
			close(done)
		}
	})

	var producers sync.WaitGroup
	for k := range keys {
		producers.Go(func() {
			for n := range perKey {
				p.Submit(fmt.Sprintf("attempt-%d", k), item{fmt.Sprintf("attempt-%d", k), n})
			}
		})
	}
	producers.Go(func() {
		for n := range singles {
			key := fmt.Sprintf("op-%d", n)
			p.Submit(key, item{key, 0})
		}
	})
	producers.Wait()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d of %d items applied; the rest wait in queues nobody reads", applied, total)
	}
	mu.Lock()
	if len(order) > 0 {
		t.Fatalf("out of order: %v", order)
	}
	mu.Unlock()
	// Each key's goroutine exits once its queue is empty.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		left := p.Len()
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d queues left 10s after every item was applied", left)
		}
	}
}

// TestPoolBackPressure: Submit waits while Queue jobs wait, resumes when
// one starts, and gives up when the context ends; a slow key holds up no
// other key.
func TestPoolBackPressure(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	release := make(chan struct{})
	ran := make(chan string, 16)
	p := keyed.NewPool(ctx, &wg, keyed.PoolOptions{Workers: 2, Queue: 2}, func(ctx context.Context, key string) {
		if key == "slow" {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		ran <- key
	})
	// "slow" runs and blocks; two more of it wait and fill the queue.
	for range 3 {
		if !p.Submit("slow", "slow") {
			t.Fatal("refused")
		}
	}
	// A full queue makes the next Submit wait, even for another key.
	submitted := make(chan bool)
	go func() { submitted <- p.Submit("fast", "fast") }()
	select {
	case <-submitted:
		t.Fatal("Submit did not wait on a full queue")
	case <-time.After(50 * time.Millisecond):
	}
	release <- struct{}{} // the first slow job ends; the next one starts, making room
	if ok := <-submitted; !ok {
		t.Fatal("Submit refused after room was made")
	}
	// "fast" runs beside the blocked "slow" (two workers).
	deadline := time.After(5 * time.Second)
	for seen := false; !seen; {
		select {
		case k := <-ran:
			seen = k == "fast"
		case <-deadline:
			t.Fatal("a fast key waited for a slow one")
		}
	}
	// Queue full again: a waiting Submit gives up when the context ends.
	p.Submit("slow2", "slow")
	p.Submit("slow2", "slow")
	go func() { submitted <- p.Submit("late", "late") }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case ok := <-submitted:
		if ok {
			t.Fatal("a Submit waiting for room queued its job after cancel")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a Submit waiting for room did not end with the context")
	}
}

// TestPoolDropsQueuedOnCancel: once the context ends, queued jobs are
// dropped and wg.Wait returns when the job in hand does.
func TestPoolDropsQueuedOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	started := make(chan struct{}, 1)
	var runs atomic.Int32
	p := keyed.NewPool(ctx, &wg, keyed.PoolOptions{}, func(ctx context.Context, _ int) {
		runs.Add(1)
		started <- struct{}{}
		<-ctx.Done()
	})
	for i := range 5 {
		p.Submit("k", i)
	}
	<-started
	cancel()
	wg.Wait()
	if n := runs.Load(); n != 1 {
		t.Fatalf("%d jobs ran, want only the one in hand", n)
	}
	if n := p.Len(); n != 0 {
		t.Fatalf("%d keys left after stop", n)
	}
}
