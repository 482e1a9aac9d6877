package agent

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestAttemptQueuesApplyEverythingInOrder: every pushed item is applied,
// and those of one key in push order. The race it guards: a key's goroutine
// finding its queue empty and exiting just as a push for that key hands
// over its item, which then waited unread until the command's AckWait
// redelivered it (seen as a 30 s stall in `warmfleet-bench rtt`).
func TestAttemptQueuesApplyEverythingInOrder(t *testing.T) {
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
	qs := newAttemptQueues(func(_ context.Context, it item) {
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
	}, wg.Go)

	var producers sync.WaitGroup
	for k := range keys {
		producers.Go(func() {
			for n := range perKey {
				qs.push(ctx, fmt.Sprintf("attempt-%d", k), item{fmt.Sprintf("attempt-%d", k), n})
			}
		})
	}
	producers.Go(func() {
		for n := range singles {
			key := fmt.Sprintf("op-%d", n)
			qs.push(ctx, key, item{key, 0})
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
		qs.mu.Lock()
		left := len(qs.queues)
		qs.mu.Unlock()
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d queues left 10s after every item was applied", left)
		}
	}
}
