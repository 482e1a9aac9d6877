package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
)

// env is one measurement's world: a bench dir, an embedded NATS server on
// loopback, and optionally a control plane running in this process.
type env struct {
	g   *globals
	dir string
	// storeDir holds the NATS store: in dir unless --store-dir.
	storeDir string
	srv      *bus.Embedded
	url      string
	log      *zap.Logger // the control plane's logger (a file in dir)

	cp       *controlplane.ControlPlane
	cpConn   *bus.Conn
	cpCancel context.CancelFunc
	cpDone   chan error
	conns    []*bus.Conn
}

// newEnv makes a bench dir and starts NATS in it.
func newEnv(g *globals, name string) (*env, error) {
	dir, err := os.MkdirTemp("", "wfbench-"+name+"-")
	if err != nil {
		return nil, err
	}
	e := &env{g: g, dir: dir, storeDir: filepath.Join(dir, "jetstream")}
	if g.storeDir != "" {
		if e.storeDir, err = os.MkdirTemp(g.storeDir, "wfbench-"+name+"-js-"); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("--store-dir: %w", err)
		}
	}
	e.srv, err = bus.StartEmbedded(bus.EmbeddedOptions{StoreDir: e.storeDir, Host: "127.0.0.1", Port: -1})
	if err != nil {
		_ = os.RemoveAll(dir)
		_ = os.RemoveAll(e.storeDir)
		return nil, err
	}
	e.url = e.srv.URL()
	e.log, err = newFileLogger(g.cpLogLevel, filepath.Join(dir, "cp.log"))
	if err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// startEnv is newEnv with a control plane of cfg running in it.
func startEnv(g *globals, name string, cfg controlplane.Config) (*env, error) {
	e, err := newEnv(g, name)
	if err != nil {
		return nil, err
	}
	if err := e.startCP(cfg); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// newFileLogger is the production JSON logger `warmfleet serve` uses, into a
// file: the control plane pays for its logging here as it does in service.
func newFileLogger(level, path string) (*zap.Logger, error) {
	if level == "none" || level == "" {
		return zap.NewNop(), nil
	}
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--cp-log-level %q: use debug, info, warn, error or none", level)
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.Sampling = nil
	cfg.OutputPaths = []string{path}
	cfg.ErrorOutputPaths = []string{path}
	cfg.EncoderConfig.TimeKey = "ts"
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	return cfg.Build()
}

// connect opens a client connection to the bench's NATS.
func (e *env) connect(name string, extra ...nats.Option) (*bus.Conn, error) {
	c, err := bus.Connect(e.url, name, zap.NewNop(), extra...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.WaitConnected(ctx); err != nil {
		c.Close()
		return nil, err
	}
	e.conns = append(e.conns, c)
	return c, nil
}

// through runs start with e's new connections made to url (a proxy in
// front of NATS) instead of to NATS itself.
func (e *env) through(url string, start func() error) error {
	direct := e.url
	e.url = url
	defer func() { e.url = direct }()
	return start()
}

// startCP runs a control plane in this process and waits until it serves.
func (e *env) startCP(cfg controlplane.Config) error {
	conn, err := e.connect("warmfleet-cp")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	cp, err := controlplane.New(ctx, conn, cfg, e.log)
	if err != nil {
		cancel()
		return err
	}
	e.cp, e.cpConn, e.cpCancel, e.cpDone = cp, conn, cancel, make(chan error, 1)
	go func() { e.cpDone <- cp.Run(ctx) }()
	select {
	case <-cp.Ready():
		return nil
	case err := <-e.cpDone:
		return fmt.Errorf("control plane stopped before it was ready: %w", err)
	case <-time.After(30 * time.Second):
		return errors.New("control plane not ready in 30s")
	}
}

// close stops the control plane, the connections and NATS, and removes the
// bench dir unless --keep.
func (e *env) close() {
	if e.cpCancel != nil {
		e.cpCancel()
		select {
		case <-e.cpDone:
		case <-time.After(20 * time.Second):
			fmt.Fprintln(os.Stderr, "warmfleet-bench: control plane did not stop in 20s")
		}
	}
	for _, c := range e.conns {
		c.Close()
	}
	if e.log != nil {
		_ = e.log.Sync()
	}
	if e.srv != nil {
		e.srv.Shutdown()
	}
	if e.g.keep {
		fmt.Fprintln(os.Stderr, "warmfleet-bench: kept", e.dir, e.storeDir)
		return
	}
	_ = os.RemoveAll(e.dir)
	_ = os.RemoveAll(e.storeDir)
}
