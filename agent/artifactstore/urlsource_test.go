package artifactstore

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

func TestURLSourceAuthRefused(t *testing.T) {
	_, digest := content(t, 10)
	for _, code := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		var requests atomic.Int64
		var sawAuth atomic.Bool
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			requests.Add(1)
			sawAuth.Store(r.Header.Get("Authorization") == "Bearer s3cret")
			w.WriteHeader(code)
		}))
		s := newStore(t)
		_, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: 10, Source: NewURLSource(srv.Client(), srv.URL+"/m.bin", map[string]string{"Authorization": "Bearer s3cret"})})
		srv.Close()
		if !errors.Is(err, ErrSourceAuth) {
			t.Fatalf("%d: err %v, want ErrSourceAuth", code, err)
		}
		if strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), digest) {
			t.Fatalf("error %q", err)
		}
		if requests.Load() != 1 || !sawAuth.Load() {
			t.Fatalf("%d requests (auth sent %v); a refusal is not retried", requests.Load(), sawAuth.Load())
		}
	}
}

func TestURLSourceStatuses(t *testing.T) {
	_, digest := content(t, 10)
	for code, want := range map[int]error{http.StatusNotFound: ErrNotFound, http.StatusTeapot: nil, http.StatusServiceUnavailable: nil} {
		var requests atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			requests.Add(1)
			w.WriteHeader(code)
		}))
		s := newStore(t)
		_, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: 10, Source: NewURLSource(srv.Client(), srv.URL+"/m.bin?sig=presigned", nil)})
		srv.Close()
		if err == nil || (want != nil && !errors.Is(err, want)) {
			t.Fatalf("%d: err %v", code, err)
		}
		if strings.Contains(err.Error(), "presigned") {
			t.Fatalf("error carries the query: %v", err)
		}
		// Only a server error is worth retrying.
		if wantReq := map[bool]int64{true: 4, false: 1}[code >= 500]; requests.Load() != wantReq {
			t.Fatalf("%d: %d requests, want %d", code, requests.Load(), wantReq)
		}
	}
}

func TestRangeStart(t *testing.T) {
	for in, want := range map[string]int64{"bytes 100-199/200": 100, "bytes 0-0/1": 0, "": -1, "bytes x-1/2": -1, "items 1-2/3": -1, "bytes 5": -1} {
		if got := rangeStart(in); got != want {
			t.Errorf("rangeStart(%q) = %d, want %d", in, got, want)
		}
	}
}
