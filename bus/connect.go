package bus

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// Conn is a NATS connection with its JetStream context.
type Conn struct {
	NC *nats.Conn
	JS jetstream.JetStream
}

// Connect dials url and reconnects forever; connection changes are logged.
func Connect(url, name string, log *zap.Logger, extra ...nats.Option) (*Conn, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", zap.Error(err))
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", zap.String("url", c.ConnectedUrlRedacted())) }),
	}
	nc, err := nats.Connect(url, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("bus: connect to %s: %w", url, err)
	}
	// An async publish whose ack never comes (a server that hung) is
	// failed after this, rather than holding a pending slot forever.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(asyncPublishTimeout))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("bus: jetstream: %w", err)
	}
	return &Conn{NC: nc, JS: js}, nil
}

// asyncPublishTimeout bounds an async publish's wait for its ack.
const asyncPublishTimeout = 10 * time.Second

// Close drains nothing: it closes at once. Callers stop their consumers first.
func (c *Conn) Close() { c.NC.Close() }

// WaitConnected blocks until the connection is up or ctx ends.
func (c *Conn) WaitConnected(ctx context.Context) error {
	for !c.NC.IsConnected() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("bus: not connected to NATS: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
