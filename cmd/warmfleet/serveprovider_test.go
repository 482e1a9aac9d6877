package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/warmfleet/warmfleet/adapters/capacity/local"
	"github.com/warmfleet/warmfleet/internal/ctrdproc"
)

func newCapacityFlags(t *testing.T, args ...string) (*serveCapacity, *cobra.Command) {
	t.Helper()
	var c serveCapacity
	cmd := &cobra.Command{Use: "serve"}
	c.register(cmd)
	if err := cmd.Flags().Parse(args); err != nil {
		t.Fatal(err)
	}
	return &c, cmd
}

// TestServeCapacity_Precedence: a flag beats the config file, which beats
// the environment, which beats the default.
func TestServeCapacity_Precedence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "provider.json")
	if err := os.WriteFile(file, []byte(`{"provider":"fake","max-rentals":2,"idle-timeout":"90s","fake-seed":9,"local-agent-arg":["--a","--b"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"WARMFLEET_PROVIDER": "shadeform", "WARMFLEET_OWNERSHIP_TOKEN": "wf-env"}
	c, cmd := newCapacityFlags(t, "--provider-config", file, "--max-rentals", "3")
	if err := c.resolve(cmd.Flags(), func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if c.provider != "fake" || c.maxRentals != 3 || c.idle != 90*time.Second || c.fakeSeed != 9 || c.ownership != "wf-env" ||
		strings.Join(c.localArgs, " ") != "--a --b" {
		t.Fatalf("resolved %+v", c)
	}
}

func TestServeCapacity_RefusesUnknownAndCredentialKeys(t *testing.T) {
	for _, body := range []string{`{"nats-url":"x"}`, `{"shadeform-api-key":"sk-123"}`, `{"open-enrollment":true}`} {
		file := filepath.Join(t.TempDir(), "provider.json")
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		c, cmd := newCapacityFlags(t, "--provider-config", file)
		err := c.resolve(cmd.Flags(), func(string) string { return "" })
		if err == nil || strings.Contains(err.Error(), "sk-123") {
			t.Errorf("%s: %v", body, err)
		}
	}
}

// TestServeCapacity_Build: no provider means no capacity; fake builds with
// a default ownership token; shadeform takes its key from the environment
// and neither its error nor its logs carry the key.
func TestServeCapacity_Build(t *testing.T) {
	ctx := context.Background()
	c, cmd := newCapacityFlags(t)
	if cc, _, _, err := c.build(ctx, cmd.Flags(), t.TempDir(), zap.NewNop()); err != nil || cc != nil {
		t.Fatalf("no provider: %+v %v", cc, err)
	}
	c, cmd = newCapacityFlags(t, "--provider", "fake", "--connection-id", "lab")
	cc, _, _, err := c.build(ctx, cmd.Flags(), t.TempDir(), zap.NewNop())
	if err != nil || cc == nil || len(cc.Connections) != 1 || cc.Connections[0].ID != "lab" || cc.Connections[0].OwnershipToken != "warmfleet-lab" ||
		!cc.Connections[0].Provider.Support().Resume {
		t.Fatalf("fake: %+v %v", cc, err)
	}
	c, cmd = newCapacityFlags(t, "--provider", "local", "--local-agent", filepath.Join(t.TempDir(), "missing"))
	if _, _, _, err := c.build(ctx, cmd.Flags(), t.TempDir(), zap.NewNop()); err == nil {
		t.Fatal("local provider without an agent binary was built")
	}

	const secret = "sk-very-secret-4242"
	t.Setenv("SHADEFORM_API_KEY", secret)
	core, logs := observer.New(zap.DebugLevel)
	c, cmd = newCapacityFlags(t, "--provider", "shadeform", "--shadeform-base-url", "http://127.0.0.1:1/v1")
	_, _, _, err = c.build(ctx, cmd.Flags(), t.TempDir(), zap.New(core))
	if err == nil {
		t.Fatal("verify against an unreachable API succeeded")
	}
	if strings.Contains(err.Error(), secret) {
		t.Fatalf("the key is in the error: %v", err)
	}
	for _, e := range logs.All() {
		if strings.Contains(e.Message, secret) || strings.Contains(fmt.Sprint(e.ContextMap()), secret) {
			t.Fatalf("the key is in the log: %+v", e)
		}
	}
	c, cmd = newCapacityFlags(t, "--provider", "nope")
	if _, _, _, err := c.build(ctx, cmd.Flags(), t.TempDir(), zap.NewNop()); err == nil {
		t.Fatal("an unknown provider was accepted")
	}
}

// TestServeCapacity_LocalContainerdMode: auto picks per-machine only when
// it can and the agent flags name no daemon; an explicit per-machine that
// cannot be honoured is refused rather than quietly shared.
func TestServeCapacity_LocalContainerdMode(t *testing.T) {
	ok := func() error { return nil }
	missing := func() error { return ctrdproc.ErrUnavailable }
	addr := []string{"--containerd-address=/run/containerd/containerd.sock"}
	for _, tc := range []struct {
		mode       string
		args       []string
		check      func() error
		perMachine bool
		fails      bool
	}{
		{"auto", nil, ok, true, false},
		{"auto", nil, missing, false, false},
		{"auto", addr, ok, false, false},
		{"shared", nil, ok, false, false},
		{"per-machine", nil, ok, true, false},
		{"per-machine", nil, missing, false, true},
		{"per-machine", addr, ok, false, true},
		{"sometimes", nil, ok, false, true},
	} {
		pm, why, err := localContainerdMode(tc.mode, tc.args, tc.check)
		if pm != tc.perMachine || (err != nil) != tc.fails || (err == nil && why == "") {
			t.Errorf("%s %v: per-machine %v, %q, %v", tc.mode, tc.args, pm, why, err)
		}
	}
	if _, _, err := localContainerdMode("per-machine", addr, ok); !errors.Is(err, local.ErrContainerdAddressGiven) {
		t.Errorf("untyped: %v", err)
	}
}
