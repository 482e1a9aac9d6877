package bus

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// logDrainTimeout bounds closing a log connection: acks still due, then
// the socket.
const logDrainTimeout = 10 * time.Second

// RunLogDialer is, for an agent logging in to NATS (creds), how it opens
// the connection it ships one Run's output on: same URL and base options
// (TLS), user
// bus.NodeLogUser(node, run), the node's session token as read from creds
// at dial time. The callout admits it only while the Run's current attempt
// is booked on this node, and only to publish bus.RunLogsSubject(its tenant, run). A refused
// login fails the dial at once (no retrying); the returned func drains and
// closes the connection. Without a login (creds nil) it is nil: the
// agent ships on its own connection.
func RunLogDialer(natsURL, nodeID string, base []nats.Option, creds *Credentials, log *zap.Logger) func(ctx context.Context, runID string) (jetstream.JetStream, func(), error) {
	if creds == nil {
		return nil
	}
	return func(ctx context.Context, runID string) (jetstream.JetStream, func(), error) {
		if err := ctx.Err(); err != nil {
			return nil, nil, fmt.Errorf("log connection for run %s: %w", runID, err)
		}
		opts := append([]nats.Option{}, base...)
		closed := make(chan struct{})
		opts = append(opts, NodeLogCredentials(nodeID, runID, creds.Secret()).Options()...)
		opts = append(opts,
			nats.RetryOnFailedConnect(false),
			nats.DrainTimeout(logDrainTimeout),
			nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
		conn, err := Connect(natsURL, "warmfleet-agent "+nodeID+" logs "+runID, log.With(zap.String("run_id", runID)), opts...)
		if err != nil {
			return nil, nil, fmt.Errorf("log connection for run %s: %w", runID, err)
		}
		var once sync.Once
		closeConn := func() {
			once.Do(func() {
				if err := conn.NC.Drain(); err != nil {
					conn.NC.Close()
				}
				select {
				case <-closed:
				case <-time.After(logDrainTimeout + time.Second):
					conn.NC.Close()
				}
			})
		}
		if err := ctx.Err(); err != nil {
			closeConn()
			return nil, nil, fmt.Errorf("log connection for run %s: %w", runID, err)
		}
		return conn.JS, closeConn, nil
	}
}
