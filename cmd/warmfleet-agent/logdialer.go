package main

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
)

// newLogDialer is bus.RunLogDialer with the agent's TLS files; nil without
// --nats-auth (creds nil), so the agent ships on its own connection.
func newLogDialer(natsURL, nodeID string, natsTLS bus.TLSFiles, creds *bus.Credentials, log *zap.Logger) func(ctx context.Context, runID string) (jetstream.JetStream, func(), error) {
	if creds == nil {
		return nil
	}
	opts, err := natsTLS.ClientOptions()
	if err != nil {
		// The agent's own connection was built from the same files, so this
		// cannot fail here after it succeeded there; say so if it does.
		return func(context.Context, string) (jetstream.JetStream, func(), error) { return nil, nil, err }
	}
	return bus.RunLogDialer(natsURL, nodeID, opts, creds, log)
}
