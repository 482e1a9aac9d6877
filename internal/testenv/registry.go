package testenv

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Registry is an OCI distribution endpoint over plain HTTP on 127.0.0.1,
// serving the blobs of image archives: containerd treats loopback hosts as
// plain-HTTP registries, so a test can pull without a network.
type Registry struct {
	// Host is "127.0.0.1:<port>", the registry part of a reference.
	Host  string
	blobs map[string][]byte // "sha256:<hex>" → content
	types map[string]string // manifest digest → media type
	// chunkDelay slows blob bodies so a pull lasts long enough to watch.
	chunkDelay time.Duration
}

// ServeRegistry serves the given archives until the test ends. Every blob
// body is written in 64 KiB chunks, chunkDelay apart.
func ServeRegistry(t testing.TB, chunkDelay time.Duration, images ...Image) *Registry {
	t.Helper()
	r := &Registry{blobs: map[string][]byte{}, types: map[string]string{}, chunkDelay: chunkDelay}
	for _, img := range images {
		if err := r.load(img.ArchivePath); err != nil {
			t.Fatalf("registry: load %s: %v", img.ArchivePath, err)
		}
		var m struct {
			MediaType string `json:"mediaType"`
		}
		if err := json.Unmarshal(r.blobs[img.ManifestDigest], &m); err != nil {
			t.Fatalf("registry: manifest %s: %v", img.ManifestDigest, err)
		}
		r.types[img.ManifestDigest] = m.MediaType
	}
	srv := httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(srv.Close)
	r.Host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

// load reads an OCI image-layout tar's blobs.
func (r *Registry) load(path string) error {
	f, err := os.Open(path)
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
		hex, ok := strings.CutPrefix(h.Name, "blobs/sha256/")
		if !ok || h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		r.blobs["sha256:"+hex] = b
	}
}

// serve answers /v2/, and /v2/<name>/{manifests,blobs}/<digest> by digest.
func (r *Registry) serve(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path == "/v2/" {
		return
	}
	i := strings.LastIndex(req.URL.Path, "/")
	dgst := req.URL.Path[i+1:]
	b, ok := r.blobs[dgst]
	if !ok || !strings.HasPrefix(req.URL.Path, "/v2/") {
		http.Error(w, `{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}`, http.StatusNotFound)
		return
	}
	ct := "application/octet-stream"
	if strings.Contains(req.URL.Path, "/manifests/") {
		ct = r.types[dgst]
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Docker-Content-Digest", dgst)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	if req.Method == http.MethodHead {
		return
	}
	const chunk = 64 << 10
	for off := 0; off < len(b); off += chunk {
		if _, err := w.Write(b[off:min(off+chunk, len(b))]); err != nil {
			return
		}
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		if r.chunkDelay > 0 && !strings.Contains(req.URL.Path, "/manifests/") {
			select {
			case <-req.Context().Done():
				return
			case <-time.After(r.chunkDelay):
			}
		}
	}
}
