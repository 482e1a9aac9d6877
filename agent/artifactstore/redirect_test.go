package artifactstore

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// seenHeaders records, per server, the configured headers each request
// brought.
type seenHeaders struct {
	mu   sync.Mutex
	hits map[string][]http.Header
}

func (s *seenHeaders) record(name string, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hits == nil {
		s.hits = map[string][]http.Header{}
	}
	s.hits[name] = append(s.hits[name], r.Header.Clone())
}

func (s *seenHeaders) of(name string) []http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[name]
}

// TestURLSourceRedirectsKeepCredentials: a source whose server demands the
// configured headers redirects to another host (https, and plain http to
// plain http) and from https to plain http. Neither target sees a
// configured header or a credential; the https → http redirect is refused
// before any request reaches the target and is not retried; a redirect
// within the first origin keeps the headers and serves the bytes.
func TestURLSourceRedirectsKeepCredentials(t *testing.T) {
	b, digest := content(t, 4096)
	headers := map[string]string{"Authorization": "Bearer s3cret", "X-Api-Key": "k3y", "Cookie": "session=c00kie"}
	var seen seenHeaders
	target := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			seen.record(name, r)
			_, _ = w.Write(b)
		}
	}
	otherTLS := httptest.NewTLSServer(target("other https host"))
	defer otherTLS.Close()
	plain := httptest.NewServer(target("plain http"))
	defer plain.Close()
	otherPlain := httptest.NewServer(target("other plain host"))
	defer otherPlain.Close()
	// origin demands the headers and redirects as its path says.
	origin := func(name string, to map[string]string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			seen.record(name, r)
			if r.Header.Get("X-Api-Key") != "k3y" || r.Header.Get("Authorization") != "Bearer s3cret" {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			if loc, ok := to[r.URL.Path]; ok {
				http.Redirect(w, r, loc, http.StatusFound)
				return
			}
			_, _ = w.Write(b)
		}
	}
	src := httptest.NewTLSServer(origin("origin", map[string]string{
		"/cross": otherTLS.URL + "/m.bin?sig=presigned",
		"/down":  plain.URL + "/m.bin",
		"/same":  "/m.bin",
	}))
	defer src.Close()
	plainOrigin := httptest.NewServer(origin("plain origin", map[string]string{"/cross": otherPlain.URL + "/m.bin"}))
	defer plainOrigin.Close()
	client := src.Client() // trusts httptest's certificate, which both TLS servers use

	fetch := func(rawURL string) error {
		s := newStore(t)
		_, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(len(b)), Source: NewURLSource(client, rawURL, headers)})
		return err
	}
	configured := func(h http.Header) []string {
		var got []string
		for k := range headers {
			if h.Get(k) != "" {
				got = append(got, k)
			}
		}
		return got
	}

	// Another host: followed, without the headers.
	for _, c := range []struct{ from, target string }{{src.URL + "/cross", "other https host"}, {plainOrigin.URL + "/cross", "other plain host"}} {
		if err := fetch(c.from); err != nil {
			t.Fatalf("redirect to %s: %v", c.target, err)
		}
		hits := seen.of(c.target)
		if len(hits) != 1 {
			t.Fatalf("%s saw %d requests, want 1", c.target, len(hits))
		}
		if got := configured(hits[0]); len(got) != 0 {
			t.Errorf("%s saw the configured headers %v", c.target, got)
		}
		if ref := hits[0].Get("Referer"); ref != "" {
			t.Errorf("%s saw the previous URL as Referer %q", c.target, ref)
		}
	}

	// https to plain http: refused, permanent, and the target sees nothing.
	err := fetch(src.URL + "/down")
	if !errors.Is(err, errDowngrade) || !isPermanent(err) {
		t.Fatalf("https → http redirect: %v, want a permanent refusal", err)
	}
	if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "k3y") {
		t.Fatalf("the refusal names a credential: %v", err)
	}
	if hits := seen.of("plain http"); len(hits) != 0 {
		t.Fatalf("the plain http target saw %d requests", len(hits))
	}

	// Within the origin: the headers go along and the bytes come.
	before := len(seen.of("origin"))
	if err := fetch(src.URL + "/same"); err != nil {
		t.Fatalf("same-host redirect: %v", err)
	}
	hits := seen.of("origin")[before:]
	if len(hits) != 2 || len(configured(hits[1])) != len(headers) {
		t.Fatalf("same-host redirect: %d requests, the second with %v", len(hits), configured(hits[len(hits)-1]))
	}
}

// TestOrigin: scheme, host and port, default ports filled in, case folded.
func TestOrigin(t *testing.T) {
	same := [][2]string{
		{"https://a.example/x", "HTTPS://A.example:443/y?q=1"},
		{"http://a.example:80/", "http://a.example/"},
		{"https://[::1]:8443/", "https://[::1]:8443/z"},
	}
	differ := [][2]string{
		{"https://a.example/", "http://a.example/"},
		{"https://a.example/", "https://a.example:8443/"},
		{"https://a.example/", "https://b.a.example/"},
		{"https://a.example/", "https://a.example.evil.org/"},
	}
	parse := func(s string) *url.URL {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	for _, c := range same {
		if origin(parse(c[0])) != origin(parse(c[1])) {
			t.Errorf("%s and %s differ", c[0], c[1])
		}
	}
	for _, c := range differ {
		if origin(parse(c[0])) == origin(parse(c[1])) {
			t.Errorf("%s and %s are one origin", c[0], c[1])
		}
	}
}
