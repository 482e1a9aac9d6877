package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.yaml.in/yaml/v3"

	"github.com/warmfleet/warmfleet/adapters/capacity/cloudinit"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// Bad cloud-init options are refused before any control plane is asked,
// so no token is minted for user data that would not be written.
func TestNodeInviteRefusesBadCloudInitOptionsFirst(t *testing.T) {
	const nowhere = "nats://127.0.0.1:1"
	_, err := cli(t, nowhere, "node", "invite", "--node", "n1", "--format", "cloud-init", "--agent-url", "https://dl.example/a", "--agent-sha256", "abc")
	if !errors.Is(err, &schemas.Refusal{Code: schemas.CodeInvalidDigest, Field: "agent_sha256"}) {
		t.Errorf("short sha256: %v", err)
	}
	_, err = cli(t, nowhere, "node", "invite", "--node", "n1", "--agent-url", "https://dl.example/a")
	if err == nil || !strings.Contains(err.Error(), "--agent-url applies only to --format cloud-init") {
		t.Errorf("--agent-url without --format cloud-init: %v", err)
	}
	_, err = cli(t, nowhere, "node", "invite", "--node", "n1", "--format", "yaml")
	if err == nil || !strings.Contains(err.Error(), "--format") {
		t.Errorf("--format yaml: %v", err)
	}
}

func TestNodeInviteWritesCloudInitUserData(t *testing.T) {
	n := testenv.StartNATS(t)
	log := zap.NewNop()
	conn, err := bus.Connect(n.URL(), "cp", log)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cp, err := controlplane.New(ctx, conn, controlplane.Config{HeartbeatInterval: time.Second}, log)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cp.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-cp.Ready()

	out := filepath.Join(t.TempDir(), "user-data")
	sha := strings.Repeat("ab", 32)
	msg, err := cli(t, n.URL(), "node", "invite", "--node", "gpu-7", "--generation", "2", "--out", out, "--format", "cloud-init",
		"--agent-url", "https://dl.example/warmfleet-agent", "--agent-sha256", sha, "--install-containerd", "--package", "jq")
	if err != nil {
		t.Fatalf("%v: %s", err, msg)
	}
	if !strings.Contains(msg, "cloud-init user data for gpu-7 (generation 2) written to") {
		t.Errorf("message %q", msg)
	}
	fi, err := os.Stat(out)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("user data file: %v %v, want 0600", fi, err)
	}
	data, _ := os.ReadFile(out)
	var u struct {
		Packages   []string `yaml:"packages"`
		WriteFiles []struct {
			Path, Content string
		} `yaml:"write_files"`
		Runcmd [][]string `yaml:"runcmd"`
	}
	if !bytes.HasPrefix(data, []byte("#cloud-config\n")) || yaml.Unmarshal(data, &u) != nil {
		t.Fatalf("not #cloud-config YAML:\n%s", data)
	}
	var boot schemas.NodeBootstrap
	for _, f := range u.WriteFiles {
		if f.Path == cloudinit.BootstrapPath {
			raw, _ := base64.StdEncoding.DecodeString(f.Content)
			if err := json.Unmarshal(raw, &boot); err != nil {
				t.Fatal(err)
			}
		}
	}
	if boot.NodeID != "gpu-7" || boot.Generation != 2 || boot.EnrollmentToken == "" {
		t.Errorf("bootstrap %+v", boot)
	}
	if bytes.Contains(data, []byte(boot.EnrollmentToken)) || strings.Contains(msg, boot.EnrollmentToken) {
		t.Errorf("token in the clear")
	}
	if len(u.Runcmd) != 1 || !strings.Contains(strings.Join(u.Runcmd[0], " "), "agent_sha256="+sha) || !strings.Contains(strings.Join(u.Packages, " "), "containerd runc jq") {
		t.Errorf("runcmd %q packages %v", u.Runcmd, u.Packages)
	}
}
