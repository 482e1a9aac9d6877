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
	// Auth, when set, turns authentication on (see auth.go): only
	// Auth.ServiceUser logs in directly, every other login goes to the
	// control plane's auth callout. Nil keeps the server open, for
	// development and the tests that need no auth.
	Auth *EmbeddedAuth
	// TLS, when it names files, makes every client connection TLS.
	TLS TLSFiles
	// SyncAlways fsyncs every JetStream write before acknowledging it;
	// false keeps nats-server's default, a flush every two minutes, which
	// loses acknowledged writes on power loss (docs/benchmarks.md, 9).
	SyncAlways bool
}

// EmbeddedAuth turns on auth callout in the embedded server.
type EmbeddedAuth struct {
	// ServiceUser and ServicePassword are the control plane's own login:
	// full permissions, and the one that serves the auth callout.
	ServiceUser, ServicePassword string
	// Issuer is the public account nkey (A...) whose signature the server
	// accepts on callout answers; the control plane holds its seed.
	Issuer string
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
		SyncAlways: o.SyncAlways,
	}
	if a := o.Auth; a != nil {
		if a.ServiceUser == "" || a.ServicePassword == "" || a.Issuer == "" {
			return nil, errors.New("bus: embedded auth needs a service user, its password and the callout issuer's public key")
		}
		opts.Users = []*server.User{{Username: a.ServiceUser, Password: a.ServicePassword}}
		opts.AuthCallout = &server.AuthCallout{Issuer: a.Issuer, AuthUsers: []string{a.ServiceUser}}
		opts.AuthTimeout = 5
	}
	if o.TLS.Enabled() {
		cfg, err := o.TLS.ServerConfig()
		if err != nil {
			return nil, err
		}
		opts.TLS, opts.TLSConfig, opts.TLSVerify, opts.TLSTimeout = true, cfg, o.TLS.VerifyClients, 5
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
