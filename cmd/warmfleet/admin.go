package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// admin sends an operator request to the control plane and decodes its
// answer into T, or returns its refusal. A request this login may not
// publish fails with the server's permission violation.
func admin[T any](ctx context.Context, conn *bus.Conn, subject string, req any) (T, error) {
	var zero T
	b, err := json.Marshal(req)
	if err != nil {
		return zero, err
	}
	resp, err := request(ctx, conn, subject, b)
	if err != nil {
		return zero, fmt.Errorf("no control plane answered on %s: %w", subject, err)
	}
	var rep schemas.Reply[T]
	if err := json.Unmarshal(resp.Data, &rep); err != nil {
		return zero, fmt.Errorf("reply on %s: %w", subject, err)
	}
	if rep.Refusal != nil {
		return zero, rep.Refusal
	}
	if rep.OK == nil {
		return zero, errors.New("empty reply on " + subject)
	}
	return *rep.OK, nil
}

// request sends a core request and waits for its reply. A publish the
// login may not make is dropped by the server, which says so only
// asynchronously: it watches for that while it waits, rather than waiting
// for ctx to end.
func request(ctx context.Context, conn *bus.Conn, subject string, data []byte) (*nats.Msg, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type reply struct {
		m   *nats.Msg
		err error
	}
	done := make(chan reply, 1)
	go func() {
		m, err := conn.NC.RequestWithContext(ctx, subject, data)
		done <- reply{m, err}
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			return r.m, r.err
		case <-tick.C:
			if last := conn.NC.LastError(); errors.Is(last, nats.ErrPermissionViolation) && strings.Contains(last.Error(), subject) {
				cancel()
				<-done
				return nil, last
			}
		}
	}
}

// getJSON reads one KV value for display.
func getJSON[T any](ctx context.Context, conn *bus.Conn, bucket, key, what string) (T, error) {
	var v T
	kv, err := conn.JS.KeyValue(ctx, bucket)
	if err != nil {
		return v, err
	}
	if _, err := bus.GetJSON(ctx, kv, key, &v); err != nil {
		return v, fmt.Errorf("%s %s: %w", what, key, err)
	}
	return v, nil
}

// listJSON reads every value of a bucket.
func listJSON[T any](ctx context.Context, conn *bus.Conn, bucket string) ([]T, error) {
	kv, err := conn.JS.KeyValue(ctx, bucket)
	if err != nil {
		return nil, err
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []T
	for k := range lister.Keys() {
		var v T
		if _, err := bus.GetJSON(ctx, kv, k, &v); err == nil {
			out = append(out, v)
		}
	}
	return out, nil
}
