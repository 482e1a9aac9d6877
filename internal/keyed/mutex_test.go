package keyed_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/keyed"
)

// TestMutex: one key's holders exclude each other, other keys do not wait,
// and released keys are forgotten.
func TestMutex(t *testing.T) {
	var k keyed.Mutex
	unlockA := k.Lock("a")
	acquired, released := make(chan struct{}), make(chan struct{})
	go func() {
		u := k.Lock("a")
		close(acquired)
		u()
		close(released)
	}()
	unlockB := k.Lock("b") // does not wait for "a"
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
	<-released // the waiter's own unlock may lag its acquire
	if n := k.Len(); n != 0 {
		t.Fatalf("%d keys still held", n)
	}
}

// TestMutexContext: a waiter whose context ends gives up with its error
// and is forgotten; the holder keeps the lock, and the next waiter gets it.
func TestMutexContext(t *testing.T) {
	var k keyed.Mutex
	unlock, err := k.LockContext(context.Background(), "img")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if u, err := k.LockContext(ctx, "img"); !errors.Is(err, context.DeadlineExceeded) || u != nil {
		t.Fatalf("waiter past its deadline: unlock %v, %v", u != nil, err)
	}
	if n := k.Len(); n != 1 {
		t.Fatalf("%d keys after the waiter gave up, want 1 (the holder)", n)
	}
	cancelled, stop := context.WithCancel(context.Background())
	stop()
	if _, err := k.LockContext(cancelled, "img"); !errors.Is(err, context.Canceled) {
		t.Fatalf("waiter with a cancelled context: %v", err)
	}
	got := make(chan func())
	go func() {
		u, err := k.LockContext(context.Background(), "img")
		if err != nil {
			t.Error(err)
		}
		got <- u
	}()
	unlock()
	select {
	case u := <-got:
		u()
	case <-time.After(5 * time.Second):
		t.Fatal("the next waiter never got the lock")
	}
	if n := k.Len(); n != 0 {
		t.Fatalf("%d keys still held", n)
	}
}

// TestMutexExcludes: many goroutines on few keys never hold one key twice.
func TestMutexExcludes(t *testing.T) {
	var (
		k       keyed.Mutex
		mu      sync.Mutex
		holding = map[string]int{}
		wg      sync.WaitGroup
	)
	keys := []string{"a", "b", "c"}
	for g := range 12 {
		wg.Go(func() {
			for i := range 200 {
				key := keys[(g+i)%len(keys)]
				unlock, err := k.LockContext(context.Background(), key)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				holding[key]++
				if holding[key] != 1 {
					t.Errorf("key %s held %d times", key, holding[key])
				}
				mu.Unlock()
				mu.Lock()
				holding[key]--
				mu.Unlock()
				unlock()
			}
		})
	}
	wg.Wait()
	if n := k.Len(); n != 0 {
		t.Fatalf("%d keys still held", n)
	}
}
