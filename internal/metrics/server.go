// Package metrics serves a process's Prometheus metrics and its health and
// readiness probes over HTTP, and holds the collectors that turn the
// control plane's and the agent's state into metrics at scrape time.
//
// Every process builds its own registry (no global one): the control plane
// with NewControlPlaneRegistry, the agent with NewAgentRegistry.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every warmfleet metric.
const Namespace = "warmfleet"

// shutdownGrace is how long Serve waits for in-flight scrapes once its
// context ends.
const shutdownGrace = 5 * time.Second

// Handler serves:
//
//   - /metrics: the registry, in the Prometheus exposition format;
//   - /healthz: 200 while the process is up (it answers at all);
//   - /readyz: 200 when ready() says so, 503 otherwise.
//
// A nil ready means always ready.
func Handler(reg prometheus.Gatherer, ready func() bool) http.Handler {
	if ready == nil {
		ready = func() bool { return true }
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready() {
			writeText(w, http.StatusOK, "ready\n")
			return
		}
		writeText(w, http.StatusServiceUnavailable, "not ready\n")
	})
	return mux
}

func writeText(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(body))
}

// Serve listens on addr (host:port) and serves Handler until ctx ends, then
// shuts the server down, giving in-flight scrapes a few seconds. It returns
// nil after a shutdown caused by ctx, and the error otherwise (a port in use,
// for one).
func Serve(ctx context.Context, addr string, reg prometheus.Gatherer, ready func() bool) error {
	ln, err := Listen(addr)
	if err != nil {
		return err
	}
	return ServeListener(ctx, ln, reg, ready)
}

// Listen opens the TCP listener Serve would, so a caller can fail before it
// starts anything else, and learn the port when addr asks for port 0.
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	return ln, nil
}

// ServeListener is Serve on a listener the caller opened; it closes ln.
func ServeListener(ctx context.Context, ln net.Listener, reg prometheus.Gatherer, ready func() bool) error {
	srv := &http.Server{
		Handler:           Handler(reg, ready),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics: serve on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics: serve on %s: %w", ln.Addr(), err)
	}
	return nil
}
