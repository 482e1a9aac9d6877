package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// connect opens a quiet connection for CLI use. The login comes from
// WARMFLEET_NATS_* when they name one, else from the operator login
// `warmfleet serve --auth` wrote (operatorLoginDirs), whose URL is used
// unless --nats-url or WARMFLEET_NATS_URL names another.
func (g *globals) connect(ctx context.Context) (*bus.Conn, error) {
	url := g.natsURL
	var opts []nats.Option
	login := ""
	if !bus.EnvHasLogin() {
		c, path, err := findOperatorLogin(g.loginDirs)
		if err != nil {
			return nil, err
		}
		if path != "" {
			if opts, err = c.Options(); err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			if !g.urlSet() {
				url = c.URL
			}
			login = path
		}
	}
	env, err := bus.EnvClientOptions() // TLS and login from WARMFLEET_NATS_* (docs/security.md); after, so they win
	if err != nil {
		return nil, err
	}
	conn, err := bus.Connect(url, "warmfleet-cli", zap.NewNop(), append(opts, env...)...)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := conn.WaitConnected(cctx); err != nil {
		last := conn.NC.LastError()
		conn.Close()
		if bus.IsAuthError(last) {
			if login != "" {
				return nil, fmt.Errorf("NATS at %s refused the operator login in %s (%v): is it from this server's data dir? Or set %s to the operator token file (docs/security.md)", url, login, last, bus.EnvNATSTokenFile)
			}
			return nil, fmt.Errorf("NATS at %s refused this login (%v): set %s to the operator token file, or run where `warmfleet serve --auth` keeps its data dir (docs/security.md)", url, last, bus.EnvNATSTokenFile)
		}
		var unknownCA x509.UnknownAuthorityError
		if errors.As(last, &unknownCA) {
			return nil, fmt.Errorf("NATS at %s presented a certificate from a CA this CLI does not trust: set %s to that CA's PEM file (serve --auth keeps it as <data-dir>/tls/ca.pem), or run where serve keeps its data dir", url, bus.EnvNATSCAFile)
		}
		return nil, fmt.Errorf("no NATS server at %s (start one with `warmfleet serve` or pass --nats-url): %w", url, err)
	}
	return conn, nil
}

// operatorLoginDirs are where the CLI looks for serve's operator login,
// first found wins: `make run`'s data dir (relative to where the CLI runs)
// and the shipped unit's.
func operatorLoginDirs() []string { return []string{".warmfleet", "/var/lib/warmfleet"} }

// findOperatorLogin returns the first operator login file in dirs and its
// path; none ("") when no dir holds one this user may read.
func findOperatorLogin(dirs []string) (bus.OperatorContext, string, error) {
	for _, d := range dirs {
		p := filepath.Join(d, bus.OperatorContextFile)
		c, err := bus.ReadOperatorContext(p)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			continue
		}
		if err != nil {
			return c, "", err
		}
		return c, p, nil
	}
	return bus.OperatorContext{}, "", nil
}

// render writes v as JSON with -o json, else calls table.
func (g *globals) render(w io.Writer, v any, table func(*tabwriter.Writer)) error {
	switch g.output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "table", "":
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		table(tw)
		return tw.Flush()
	default:
		return fmt.Errorf("-o %q: use table or json", g.output)
	}
}

// terminal reports whether ev moves its Run to a terminal phase.
func terminal(ev schemas.RunEvent) bool { return ev.Type == schemas.EventPhase && ev.Phase.Terminal() }

func fmtTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
