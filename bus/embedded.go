package bus

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedOptions configures an in-process nats-server with JetStream.
type EmbeddedOptions struct {
	// StoreDir holds the JetStream file store; it survives restarts.
	StoreDir string
	Host     string // default 127.0.0.1
	Port     int    // 0 = 4222; -1 = random
	// MaxPayload bounds one message; default 1 MiB.
	MaxPayload int32
}

// Embedded is a running in-process nats-server.
type Embedded struct {
	srv *server.Server
}

// StartEmbedded starts a nats-server with JetStream and waits until it
// accepts connections.
func StartEmbedded(o EmbeddedOptions) (*Embedded, error) {
	if o.StoreDir == "" {
		return nil, errors.New("bus: embedded server needs a StoreDir for the JetStream file store")
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if o.Port == 0 {
		o.Port = 4222
	}
	opts := &server.Options{
		ServerName: "warmfleet",
		Host:       o.Host,
		Port:       o.Port,
		JetStream:  true,
		StoreDir:   o.StoreDir,
		MaxPayload: o.MaxPayload,
		NoSigs:     true,
		NoLog:      true,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("bus: configure embedded nats-server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("bus: embedded nats-server on %s:%d did not become ready in 10s", o.Host, o.Port)
	}
	return &Embedded{srv: srv}, nil
}

// URL is the client URL of the server.
func (e *Embedded) URL() string { return e.srv.ClientURL() }

// Server exposes the underlying server for tests that need its internals.
func (e *Embedded) Server() *server.Server { return e.srv }

// Shutdown stops the server and waits for it to finish.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}
