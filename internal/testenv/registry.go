package testenv

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/crypto/bcrypt"
)

// RegistryBinary is Debian's docker-registry package: the CNCF distribution
// registry.
const RegistryBinary = "/usr/bin/docker-registry"

// Registry is a real OCI distribution registry (Debian's docker-registry)
// serving plain HTTP on 127.0.0.1 with htpasswd basic auth, its storage in
// the test's temp dir. containerd treats loopback hosts as plain-HTTP
// registries, so a test pulls without TLS and without a network.
type Registry struct {
	// Host is "127.0.0.1:<port>", the registry part of a reference. With
	// WithBlobDelay it is the slowing proxy's address.
	Host string
	// User and Password are the one account htpasswd admits; empty with
	// WithoutAuth.
	User, Password string
	// Direct is the registry's own address, behind any proxy.
	Direct string
}

// RegistryOption varies StartRegistry.
type RegistryOption func(*registryConfig)

type registryConfig struct {
	blobDelay time.Duration
	noAuth    bool
}

// WithBlobDelay puts a loopback proxy in front of the registry that writes
// blob bodies in 64 KiB chunks, d apart, so a pull lasts long enough to
// watch. Host is then the proxy's address.
func WithBlobDelay(d time.Duration) RegistryOption {
	return func(c *registryConfig) { c.blobDelay = d }
}

// WithoutAuth serves anonymous pulls and pushes.
func WithoutAuth() RegistryOption {
	return func(c *registryConfig) { c.noAuth = true }
}

// StartRegistry starts docker-registry on a free loopback port and stops it
// when the test ends. It skips t when the package is missing, and fails t
// instead when CI is set.
func StartRegistry(t testing.TB, opts ...RegistryOption) *Registry {
	t.Helper()
	if _, err := os.Stat(RegistryBinary); err != nil {
		unavailable(t, "%s missing (%v): apt-get install -y docker-registry", RegistryBinary, err)
	}
	var cfg registryConfig
	for _, o := range opts {
		o(&cfg)
	}
	dir := t.TempDir()
	r := &Registry{}
	auth := ""
	if !cfg.noAuth {
		r.User, r.Password = "warmfleet", "pw-"+randomHex(t, 12)
		hash, err := bcrypt.GenerateFromPassword([]byte(r.Password), bcrypt.MinCost)
		if err != nil {
			t.Fatalf("registry: htpasswd: %v", err)
		}
		htpasswd := filepath.Join(dir, "htpasswd")
		if err := os.WriteFile(htpasswd, []byte(r.User+":"+string(hash)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		auth = fmt.Sprintf("auth:\n  htpasswd:\n    realm: warmfleet-test\n    path: %s\n", htpasswd)
	}

	// The registry picks no port of its own: take a free one and retry on
	// the rare race with another listener.
	var lastErr error
	for range 5 {
		addr := freeLoopbackAddr(t)
		config := fmt.Sprintf(`version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
  secret: %s
%s`, filepath.Join(dir, "storage"), addr, randomHex(t, 16), auth)
		cfgPath := filepath.Join(dir, "config.yml")
		if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cmd := exec.CommandContext(ctx, RegistryBinary, "serve", cfgPath)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			cancel()
			t.Fatalf("registry: start: %v", err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		if err := waitRegistry(addr, exited); err != nil {
			cancel()
			<-exited
			lastErr = fmt.Errorf("%w (output: %s)", err, out.String())
			continue
		}
		t.Cleanup(func() { cancel(); <-exited })
		r.Host, r.Direct = addr, addr
		if cfg.blobDelay > 0 {
			r.Host = slowProxy(t, addr, cfg.blobDelay)
		}
		return r
	}
	t.Fatalf("registry: did not start: %v", lastErr)
	return nil
}

// waitRegistry polls /v2/ until the registry answers (200, or 401 with
// auth) or its process exits.
func waitRegistry(addr string, exited <-chan error) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("docker-registry exited: %v", err)
		default:
		}
		resp, err := client.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("docker-registry did not answer on /v2/ within 15s")
}

// freeLoopbackAddr is a port no listener held a moment ago.
func freeLoopbackAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("registry: free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func randomHex(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// slowProxy forwards to the registry at addr, writing blob bodies in 64 KiB
// chunks delay apart; manifests and the rest pass at full speed.
func slowProxy(t testing.TB, addr string, delay time.Duration) string {
	t.Helper()
	target := &url.URL{Scheme: "http", Host: addr}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if strings.Contains(resp.Request.URL.Path, "/blobs/") && resp.Request.Method == http.MethodGet {
			resp.Body = &slowBody{rc: resp.Body, delay: delay, ctx: resp.Request.Context()}
		}
		return nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("registry proxy: %v", err)
	}
	srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return ln.Addr().String()
}

// slowBody reads at most 64 KiB per delay.
type slowBody struct {
	rc    io.ReadCloser
	delay time.Duration
	ctx   context.Context
	began bool
}

func (b *slowBody) Read(p []byte) (int, error) {
	if b.began {
		select {
		case <-b.ctx.Done():
			return 0, b.ctx.Err()
		case <-time.After(b.delay):
		}
	}
	b.began = true
	return b.rc.Read(p[:min(len(p), 64<<10)])
}

func (b *slowBody) Close() error { return b.rc.Close() }

// Push uploads an OCI archive image (BuildBusyboxImage) as repo and returns
// the reference a Run pins: "<Host>/<repo>@<manifest digest>".
func (r *Registry) Push(t testing.TB, repo string, img Image) string {
	t.Helper()
	v1img := loadImage(t, img)
	ref := r.reference(t, repo)
	if err := remote.Write(ref, v1img, r.remoteOpts()...); err != nil {
		t.Fatalf("registry: push %s: %v", ref, err)
	}
	return r.pinned(t, repo, v1img)
}

// PushIndex uploads a multi-platform index of single-platform images, each
// listed under the platform its config names, and returns the reference
// pinned to the index digest.
func (r *Registry) PushIndex(t testing.TB, repo string, imgs ...Image) string {
	t.Helper()
	var idx v1.ImageIndex = empty.Index
	for _, img := range imgs {
		v1img := loadImage(t, img)
		cf, err := v1img.ConfigFile()
		if err != nil {
			t.Fatalf("registry: config of %s: %v", img.ManifestDigest, err)
		}
		p := cf.Platform()
		if p == nil {
			p = &v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant}
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: v1img, Descriptor: v1.Descriptor{Platform: p}})
	}
	idx = mutate.IndexMediaType(idx, "application/vnd.oci.image.index.v1+json")
	ref := r.reference(t, repo)
	if err := remote.WriteIndex(ref, idx, r.remoteOpts()...); err != nil {
		t.Fatalf("registry: push index %s: %v", ref, err)
	}
	return r.pinned(t, repo, idx)
}

func (r *Registry) remoteOpts() []remote.Option {
	opts := []remote.Option{remote.WithContext(context.Background())}
	if r.User != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: r.User, Password: r.Password}))
	}
	return opts
}

// reference is repo's "latest" tag on the registry itself (pushes skip
// the slowing proxy).
func (r *Registry) reference(t testing.TB, repo string) name.Reference {
	t.Helper()
	ref, err := name.NewTag(r.Direct+"/"+repo+":latest", name.Insecure)
	if err != nil {
		t.Fatalf("registry: reference %s: %v", repo, err)
	}
	return ref
}

func (r *Registry) pinned(t testing.TB, repo string, content interface{ Digest() (v1.Hash, error) }) string {
	t.Helper()
	d, err := content.Digest()
	if err != nil {
		t.Fatalf("registry: digest: %v", err)
	}
	return r.Host + "/" + repo + "@" + d.String()
}

// loadImage reads the one image of an OCI image-layout archive.
func loadImage(t testing.TB, img Image) v1.Image {
	t.Helper()
	dir := t.TempDir()
	if err := untar(img.ArchivePath, dir); err != nil {
		t.Fatalf("registry: unpack %s: %v", img.ArchivePath, err)
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatalf("registry: layout %s: %v", img.ArchivePath, err)
	}
	h, err := v1.NewHash(img.ManifestDigest)
	if err != nil {
		t.Fatalf("registry: digest %s: %v", img.ManifestDigest, err)
	}
	v1img, err := lp.Image(h)
	if err != nil {
		t.Fatalf("registry: image %s in %s: %v", img.ManifestDigest, img.ArchivePath, err)
	}
	return v1img
}

// untar extracts an OCI layout archive's regular files and directories.
func untar(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			out, err := os.Create(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
}
