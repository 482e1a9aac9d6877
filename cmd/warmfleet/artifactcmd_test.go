package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// startControlPlane runs a control plane on an embedded NATS until t ends.
func startControlPlane(t *testing.T) (*testenv.NATS, *bus.Conn) {
	t.Helper()
	n := testenv.StartNATS(t)
	conn := testenv.Dial(t, n.URL(), "cp")
	ctx, cancel := context.WithCancel(context.Background())
	cp, err := controlplane.New(ctx, conn, controlplane.Config{HeartbeatInterval: time.Second}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cp.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	<-cp.Ready()
	return n, conn
}

func writeFile(t *testing.T, size int) (path, digest string) {
	t.Helper()
	b := make([]byte, size)
	_, _ = rand.Read(b)
	path = filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return path, "sha256:" + hex.EncodeToString(sum[:])
}

func objectCount(t *testing.T, obs jetstream.ObjectStore) int {
	t.Helper()
	infos, err := obs.List(context.Background())
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return len(infos)
}

func streamMsgs(t *testing.T, conn *bus.Conn) uint64 {
	t.Helper()
	s, err := conn.JS.Stream(context.Background(), "OBJ_"+bus.ObjectBucketArtifacts)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// TestArtifactCommands: put → list → get → rm against a real control
// plane: versions with the same bytes share one content-addressed object,
// removed with the last version naming it; a put whose bytes do not match
// --digest leaves no object, no chunk and no record; register takes an
// object or a URL and names the flag it refuses.
func TestArtifactCommands(t *testing.T) {
	n, conn := startControlPlane(t)
	url := n.URL()
	ctx := context.Background()
	obs, err := conn.JS.ObjectStore(ctx, bus.ObjectBucketArtifacts)
	if err != nil {
		t.Fatal(err)
	}
	file, digest := writeFile(t, 300<<10+7) // three chunks and a bit
	object := "sha256/" + strings.TrimPrefix(digest, "sha256:")

	out, err := cli(t, url, "artifact", "put", file, "--name", "llama", "--version", "v1", "--digest", digest)
	if err != nil || !strings.Contains(out, "registered llama:v1 "+digest) || !strings.Contains(out, "object "+object+", uploaded") {
		t.Fatalf("put: %v\n%s", err, out)
	}
	out, err = cli(t, url, "artifact", "put", file, "--name", "llama", "--version", "v2")
	if err != nil || !strings.Contains(out, "already in the bucket") {
		t.Fatalf("put of the same bytes as v2: %v\n%s", err, out)
	}
	if c := objectCount(t, obs); c != 1 {
		t.Fatalf("two versions of one content hold %d objects", c)
	}
	info, err := obs.GetInfo(ctx, object)
	if err != nil || info.Digest != schemas.ObjectStoreDigest(digest) || info.Size != 300<<10+7 {
		t.Fatalf("object info %+v, %v", info, err)
	}
	before := streamMsgs(t, conn)

	// Bytes that do not match --digest: refused, nothing left behind.
	other, _ := writeFile(t, 200<<10)
	out, err = cli(t, url, "artifact", "put", other, "--name", "llama", "--version", "v3", "--digest", digest)
	if err == nil || !strings.Contains(err.Error(), string(schemas.CodeArtifactDigestMismatch)) || !strings.Contains(err.Error(), "nothing was stored") {
		t.Fatalf("a put with the wrong --digest: %v\n%s", err, out)
	}
	if c, m := objectCount(t, obs), streamMsgs(t, conn); c != 1 || m != before {
		t.Fatalf("a refused put left %d objects, %d stream messages (had %d)", c, m, before)
	}
	// Other bytes under a version already registered: refused, and the
	// object it uploaded dropped.
	out, err = cli(t, url, "artifact", "put", other, "--name", "llama", "--version", "v1")
	if err == nil || !strings.Contains(err.Error(), "versions are immutable") {
		t.Fatalf("other bytes as llama:v1: %v\n%s", err, out)
	}
	if c := objectCount(t, obs); c != 1 {
		t.Fatalf("a refused registration left its object: %d objects", c)
	}

	// Register: a URL, and the flags it names.
	out, err = cli(t, url, "artifact", "register", "--name", "dataset", "--version", "2026-12", "--url", "https://data.example.com/set.tar",
		"--digest", "sha256:"+strings.Repeat("ab", 32), "--size", "1048576", "--shared")
	if err != nil || !strings.Contains(out, "registered dataset:2026-12") {
		t.Fatalf("register --url: %v\n%s", err, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--name", "x", "--object", object, "--size", "1"}, "--digest is required"},
		{[]string{"--name", "x", "--digest", digest, "--size", "1"}, "exactly one of --object"},
		{[]string{"--name", "x", "--object", object, "--digest", digest}, "--size is required"},
		{[]string{"--name", "x", "--object", "sha256/nope", "--digest", digest, "--size", "1"}, "--object: " + string(schemas.CodeInvalidArtifact)},
		{[]string{"--name", "x", "--object", object, "--digest", digest, "--size", "5"}, "--size: " + string(schemas.CodeInvalidArtifact)},
		{[]string{"--name", "x", "--url", "https://u:p@example.com/a", "--digest", digest, "--size", "1"}, "--url: " + string(schemas.CodeInvalidArtifact)},
		{[]string{"--name", "Bad", "--object", object, "--digest", digest, "--size", "1"}, "--name \"Bad\""},
		{[]string{"--name", "x", "--object", object, "--digest", digest, "--size", "307207", "--tenant", "team-z"}, "--tenant: " + string(schemas.CodeTenantUnknown)},
		{[]string{"--name", "x", "--object", object, "--digest", digest, "--size", "307207", "--tenant", "Team_Z"}, "--tenant: " + string(schemas.CodeInvalidTenant)},
	} {
		if out, err := cli(t, url, append([]string{"artifact", "register"}, c.args...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("register %v: want an error with %q, got %v\n%s", c.args, c.want, err, out)
		}
	}

	out, err = cli(t, url, "artifact", "list")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("artifact list:\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "NAME     VERSION  TENANT   SHARED") || !strings.HasPrefix(lines[1], "dataset  2026-12  default  true") ||
		!strings.HasPrefix(lines[2], "llama    v1       default  false") ||
		!strings.HasPrefix(lines[2], "llama    v1") || !strings.HasPrefix(lines[3], "llama    v2") ||
		!strings.Contains(lines[2], shortDigest(digest)+"  300.0 KiB  object "+object) {
		t.Fatalf("list:\n%s", out)
	}
	out, err = cli(t, url, "-o", "json", "artifact", "list", "llama")
	var rs []schemas.ArtifactRecord
	if err != nil || json.Unmarshal([]byte(out), &rs) != nil || len(rs) != 2 {
		t.Fatalf("list llama -o json: %v\n%s", err, out)
	}

	for arg, version := range map[string]string{"llama": "v2", "llama:v1": "v1", "llama@" + digest: "v2"} {
		out, err := cli(t, url, "artifact", "get", arg)
		var r schemas.ArtifactRecord
		if err != nil || json.Unmarshal([]byte(out), &r) != nil || r.Version != version || r.Digest != digest || r.CreatedAt.IsZero() {
			t.Fatalf("get %s: %v\n%s", arg, err, out)
		}
	}
	for _, arg := range []string{"mistral", "llama:v9", "llama@sha256:" + strings.Repeat("0", 64)} {
		if _, err := cli(t, url, "artifact", "get", arg); err == nil || !strings.Contains(err.Error(), string(schemas.CodeArtifactUnknown)) || !strings.Contains(err.Error(), "warmfleet artifact list") {
			t.Fatalf("get %s: %v", arg, err)
		}
	}
	if _, err := cli(t, url, "artifact", "get", "llama:"); err == nil || !strings.Contains(err.Error(), "the version after :") {
		t.Fatalf("get llama: with an empty version: %v", err)
	}

	if _, err := cli(t, url, "artifact", "rm", "llama"); err == nil || !strings.Contains(err.Error(), "NAME:VERSION") {
		t.Fatalf("rm without a version: %v", err)
	}
	if out, err := cli(t, url, "artifact", "rm", "llama:v1"); err != nil || !strings.Contains(out, "removed llama:v1") {
		t.Fatalf("rm llama:v1: %v\n%s", err, out)
	}
	if _, err := obs.GetInfo(ctx, object); err != nil {
		t.Fatalf("the object llama:v2 names was removed with v1: %v", err)
	}
	if _, err := cli(t, url, "artifact", "rm", "llama:v2"); err != nil {
		t.Fatal(err)
	}
	if _, err := obs.GetInfo(ctx, object); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Fatalf("the object no version names was kept: %v", err)
	}
	if _, err := cli(t, url, "artifact", "rm", "llama:v2"); err == nil || !strings.Contains(err.Error(), string(schemas.CodeArtifactUnknown)) {
		t.Fatalf("rm of a removed version: %v", err)
	}
}

// TestArtifactPutLarge: a 64 MiB put, with --progress, is stored as an
// object the object store's own reader reads back whole and verified.
func TestArtifactPutLarge(t *testing.T) {
	n, conn := startControlPlane(t)
	file, digest := writeFile(t, 64<<20)
	out, err := cli(t, n.URL(), "artifact", "put", file, "--name", "big", "--progress")
	if err != nil {
		t.Fatalf("put: %v\n%s", err, out)
	}
	if !strings.Contains(out, "64.0 MiB / 64.0 MiB (100%)") || !strings.Contains(out, "registered big:2") {
		t.Fatalf("want progress and the record:\n%s", out)
	}
	// A deadline of the test's own: without one, nats.go bounds the whole
	// 64 MiB read by 5 s, which a loaded machine can exceed.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	obs, err := conn.JS.ObjectStore(ctx, bus.ObjectBucketArtifacts)
	if err != nil {
		t.Fatal(err)
	}
	r, err := obs.Get(ctx, "sha256/"+strings.TrimPrefix(digest, "sha256:"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	h := sha256.New()
	got, err := io.Copy(h, r) // the reader checks the object's digest at EOF
	if err != nil || got != 64<<20 || "sha256:"+hex.EncodeToString(h.Sum(nil)) != digest {
		t.Fatalf("read back %d bytes: %v", got, err)
	}
}

// FuzzParseArtifactRef: any argument is parsed into a valid name with at
// most one of a valid version or digest, that prints back as the argument,
// or refused with an error quoting it.
func FuzzParseArtifactRef(f *testing.F) {
	f.Add("llama")
	f.Fuzz(func(t *testing.T, arg string) {
		r, err := parseArtifactRef(arg)
		if err != nil {
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", arg)) {
				t.Fatalf("error %q does not quote %q", err, arg)
			}
			return
		}
		if !schemas.ValidArtifactName(r.Name) || (r.Version != "" && r.Digest != "") ||
			(r.Version != "" && schemas.ValidateArtifactVersion("v", r.Version) != nil) ||
			(r.Digest != "" && schemas.ValidateSHA256("d", r.Digest) != nil) || r.Ref() != arg {
			t.Fatalf("%q parsed as %+v", arg, r)
		}
	})
}
