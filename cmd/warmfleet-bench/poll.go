package main

import (
	"context"
	"time"
)

// poll checks done every `every` until it holds (nil) or fails (its
// error); past deadline it returns late(), and ctx's error once ctx ends.
func poll(ctx context.Context, every time.Duration, deadline time.Time, done func() (bool, error), late func() error) error {
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return late()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}
