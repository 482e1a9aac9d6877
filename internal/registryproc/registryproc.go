// Package registryproc runs a private OCI distribution registry (Debian's
// docker-registry package) on loopback for tests and benchmarks, and pushes
// images to it with go-containerregistry.
package registryproc

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
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/crypto/bcrypt"
)

// Binary is where Debian's docker-registry package installs the registry.
const Binary = "/usr/bin/docker-registry"

// ErrMissing: the registry binary is not installed.
var ErrMissing = errors.New("docker-registry is not installed (apt-get install -y docker-registry)")

// Config says how to run the registry.
type Config struct {
	// Dir holds its storage, configuration and htpasswd file.
	Dir string
	// User and Password are the one account htpasswd admits. Both empty:
	// anonymous pulls and pushes.
	User, Password string
	// BlobDelay, when set, puts a loopback proxy in front that writes blob
	// bodies in 64 KiB chunks this far apart, so a pull lasts long enough
	// to watch. Host is then the proxy's address.
	BlobDelay time.Duration
	// ReadyTimeout bounds the wait for /v2/ to answer (default 15 s).
	ReadyTimeout time.Duration
}

// Registry is a running docker-registry.
type Registry struct {
	// Host is "127.0.0.1:<port>", the registry part of a reference (the
	// proxy's, with BlobDelay).
	Host string
	// Direct is the registry's own address, behind any proxy.
	Direct         string
	User, Password string

	stop func()
}

// Start runs docker-registry on a free loopback port, plain HTTP, until
// Stop.
func Start(ctx context.Context, cfg Config) (*Registry, error) {
	if _, err := os.Stat(Binary); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMissing, err)
	}
	if (cfg.User == "") != (cfg.Password == "") {
		return nil, errors.New("registryproc: give both User and Password, or neither")
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 15 * time.Second
	}
	auth := ""
	if cfg.User != "" {
		hash, err := bcrypt.GenerateFromPassword([]byte(cfg.Password), bcrypt.MinCost)
		if err != nil {
			return nil, fmt.Errorf("registryproc: htpasswd: %w", err)
		}
		htpasswd := filepath.Join(cfg.Dir, "htpasswd")
		if err := os.WriteFile(htpasswd, []byte(cfg.User+":"+string(hash)+"\n"), 0o600); err != nil {
			return nil, err
		}
		auth = fmt.Sprintf("auth:\n  htpasswd:\n    realm: warmfleet\n    path: %s\n", htpasswd)
	}
	// The registry picks no port of its own: take a free one, and retry
	// on the rare race with another listener.
	var lastErr error
	for range 5 {
		addr, err := freeLoopbackAddr()
		if err != nil {
			return nil, err
		}
		secret, err := RandomHex(16)
		if err != nil {
			return nil, err
		}
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
%s`, filepath.Join(cfg.Dir, "storage"), addr, secret, auth)
		cfgPath := filepath.Join(cfg.Dir, "config.yml")
		if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
			return nil, err
		}
		pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		cmd := exec.CommandContext(pctx, Binary, "serve", cfgPath)
		var out lockedBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			cancel()
			return nil, fmt.Errorf("registryproc: start: %w", err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		if err := waitReady(ctx, addr, exited, cfg.ReadyTimeout); err != nil {
			cancel()
			<-exited
			lastErr = fmt.Errorf("%w (output: %s)", err, out.String())
			continue
		}
		r := &Registry{Host: addr, Direct: addr, User: cfg.User, Password: cfg.Password}
		stopProxy := func() {}
		if cfg.BlobDelay > 0 {
			if r.Host, stopProxy, err = slowProxy(addr, cfg.BlobDelay); err != nil {
				cancel()
				<-exited
				return nil, err
			}
		}
		r.stop = sync.OnceFunc(func() { stopProxy(); cancel(); <-exited })
		return r, nil
	}
	return nil, fmt.Errorf("registryproc: did not start: %w", lastErr)
}

// Stop ends the registry (and its proxy) and waits for it.
func (r *Registry) Stop() { r.stop() }

// RandomHex is n random bytes in hex, for passwords and secrets.
func RandomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < 64<<10 {
		l.b.Write(p)
	}
	return len(p), nil
}

func (l *lockedBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// waitReady polls /v2/ until the registry answers (200, or 401 with auth),
// its process exits, or timeout passes.
func waitReady(ctx context.Context, addr string, exited <-chan error, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("docker-registry exited: %v", err)
		case <-ctx.Done():
			return ctx.Err()
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
	return fmt.Errorf("docker-registry did not answer on /v2/ within %s", timeout)
}

// freeLoopbackAddr is a port no listener held a moment ago.
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("registryproc: free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// slowProxy forwards to the registry at addr, writing blob bodies in 64 KiB
// chunks delay apart; manifests and the rest pass at full speed.
func slowProxy(addr string, delay time.Duration) (string, func(), error) {
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: addr})
	proxy.ModifyResponse = func(resp *http.Response) error {
		if strings.Contains(resp.Request.URL.Path, "/blobs/") && resp.Request.Method == http.MethodGet {
			resp.Body = &slowBody{rc: resp.Body, delay: delay, ctx: resp.Request.Context()}
		}
		return nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("registryproc: proxy: %w", err)
	}
	srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { _ = srv.Close(); <-done }, nil
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

// Push uploads img as repo:latest and returns the reference a Run pins:
// "<Host>/<repo>@<manifest digest>". Pushes skip the slowing proxy.
func (r *Registry) Push(ctx context.Context, repo string, img v1.Image) (string, error) {
	ref, err := r.tag(repo)
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img, r.remoteOpts(ctx)...); err != nil {
		return "", fmt.Errorf("registryproc: push %s: %w", ref, err)
	}
	return r.pinned(repo, img)
}

// PushIndex uploads an OCI index of single-platform images, each listed
// under the platform its config names, and returns the reference pinned to
// the index digest.
func (r *Registry) PushIndex(ctx context.Context, repo string, imgs ...v1.Image) (string, error) {
	var idx v1.ImageIndex = empty.Index
	for _, img := range imgs {
		cf, err := img.ConfigFile()
		if err != nil {
			return "", fmt.Errorf("registryproc: image config: %w", err)
		}
		p := cf.Platform()
		if p == nil {
			p = &v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant}
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: p}})
	}
	idx = mutate.IndexMediaType(idx, "application/vnd.oci.image.index.v1+json")
	ref, err := r.tag(repo)
	if err != nil {
		return "", err
	}
	if err := remote.WriteIndex(ref, idx, r.remoteOpts(ctx)...); err != nil {
		return "", fmt.Errorf("registryproc: push index %s: %w", ref, err)
	}
	return r.pinned(repo, idx)
}

func (r *Registry) remoteOpts(ctx context.Context) []remote.Option {
	opts := []remote.Option{remote.WithContext(ctx)}
	if r.User != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: r.User, Password: r.Password}))
	}
	return opts
}

func (r *Registry) tag(repo string) (name.Reference, error) {
	ref, err := name.NewTag(r.Direct+"/"+repo+":latest", name.Insecure)
	if err != nil {
		return nil, fmt.Errorf("registryproc: reference %s: %w", repo, err)
	}
	return ref, nil
}

func (r *Registry) pinned(repo string, content interface{ Digest() (v1.Hash, error) }) (string, error) {
	d, err := content.Digest()
	if err != nil {
		return "", fmt.Errorf("registryproc: digest: %w", err)
	}
	return r.Host + "/" + repo + "@" + d.String(), nil
}

// LoadArchive reads the image pinned by manifestDigest from an OCI
// image-layout tar (internal/ociimage), extracting it under dir.
func LoadArchive(archive, manifestDigest, dir string) (v1.Image, error) {
	if err := untar(archive, dir); err != nil {
		return nil, fmt.Errorf("registryproc: unpack %s: %w", archive, err)
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("registryproc: layout %s: %w", archive, err)
	}
	h, err := v1.NewHash(manifestDigest)
	if err != nil {
		return nil, fmt.Errorf("registryproc: digest %q: %w", manifestDigest, err)
	}
	img, err := lp.Image(h)
	if err != nil {
		return nil, fmt.Errorf("registryproc: image %s in %s: %w", manifestDigest, archive, err)
	}
	return img, nil
}

// untar extracts an OCI layout archive's directories and regular files.
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
