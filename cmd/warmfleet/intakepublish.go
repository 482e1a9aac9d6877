package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// intakeAckWait bounds waiting for a tenant's intake stream to store a
// submit or cancel.
const intakeAckWait = 10 * time.Second

// publishIntake publishes m (a submit or a cancel, on the subject of
// g.tenant and g.identity()) into the tenant's intake stream, deduplicated
// by msgID when it is set, and waits for the stream's ack. A permission refusal (the
// login's tenant is another) and a tenant this control plane does not
// serve (no stream takes the subject) each come back saying what to do.
func publishIntake(ctx context.Context, g *globals, conn *bus.Conn, m *nats.Msg, msgID string) error {
	var opts []jetstream.PublishOpt
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	f, err := conn.JS.PublishMsgAsync(m, opts...)
	if err != nil {
		return intakeError(g, m.Subject, err)
	}
	// A publish the login may not make is dropped by the server, which
	// says so asynchronously: look for that while waiting for the ack.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	timeout := time.NewTimer(intakeAckWait)
	defer timeout.Stop()
	for {
		select {
		case <-f.Ok():
			return nil
		case err := <-f.Err():
			return intakeError(g, m.Subject, err)
		case <-tick.C:
			if last := conn.NC.LastError(); errors.Is(last, nats.ErrPermissionViolation) && strings.Contains(last.Error(), m.Subject) {
				return intakeError(g, m.Subject, last)
			}
		case <-timeout.C:
			return intakeError(g, m.Subject, context.DeadlineExceeded)
		case <-ctx.Done():
			return intakeError(g, m.Subject, ctx.Err())
		}
	}
}

// intakeError explains a failed intake publish on subject.
func intakeError(g *globals, subject string, err error) error {
	switch {
	case errors.Is(err, nats.ErrPermissionViolation) || bus.IsAuthError(err):
		return fmt.Errorf("%s: this login may not publish as %q in tenant %q: set --tenant (or %s) to the tenant of the login's producer: %w",
			subject, g.identity(), g.tenant, envTenant, err)
	case errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders):
		return &schemas.Refusal{Code: schemas.CodeTenantUnknown, Field: "--tenant",
			Reason: fmt.Sprintf("the control plane serves no tenant %q (no intake stream takes %s): check --tenant (or %s), or add the tenant to serve's --producer-tokens-file and restart it", g.tenant, subject, envTenant)}
	}
	return fmt.Errorf("%s: %w", subject, err)
}

// envTenant is the environment variable --tenant defaults from.
const envTenant = "WARMFLEET_TENANT"
