package shadeform_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/shadeform"
)

func TestErrorMapping(t *testing.T) {
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	cases := []struct {
		name       string
		status     int
		header     http.Header
		body       string
		want       error // nil: ambiguous (uncoded)
		retryAfter time.Duration
	}{
		{"unauthorized", 401, nil, `{"error":"Invalid API key"}`, capacity.ErrUnauthorized, 0},
		{"forbidden", 403, nil, `{"message":"forbidden"}`, capacity.ErrUnauthorized, 0},
		{"not found", 404, nil, `{"error":"Instance not found"}`, capacity.ErrNotFound, 0},
		{"409 out of stock", 409, nil, `{"error":"Instance type A100_80G is out of stock in us-central-2"}`, capacity.ErrOutOfStock, 0},
		{"422 insufficient capacity", 422, nil, `{"message":"Insufficient capacity in region"}`, capacity.ErrOutOfStock, 0},
		{"nested code", 400, nil, `{"error":{"code":"OUT_OF_STOCK","message":"try later"}}`, capacity.ErrOutOfStock, 0},
		{"500 no capacity", 500, nil, `{"error":"upstream: no capacity available"}`, capacity.ErrOutOfStock, 0},
		{"422 invalid", 422, nil, `{"error":"name is invalid"}`, capacity.ErrInvalid, 0},
		{"400 invalid", 400, nil, `{"error":"region is required"}`, capacity.ErrInvalid, 0},
		{"plain text 400", 400, nil, "bad request\n", capacity.ErrInvalid, 0},
		{"409 conflict", 409, nil, `{"error":"instance is busy"}`, nil, 0},
		{"500", 500, nil, `{"error":"boom"}`, nil, 0},
		{"502 html", 502, nil, "<html>bad gateway</html>", nil, 0},
		{"429 seconds", 429, hdr("Retry-After", "7"), `{"error":"rate limited"}`, capacity.ErrRateLimited, 7 * time.Second},
		{"429 date", 429, hdr("Retry-After", "Fri, 01 Mar 2030 12:00:30 GMT"), `{}`, capacity.ErrRateLimited, 30 * time.Second},
		{"429 absurd", 429, hdr("Retry-After", "99999999"), ``, capacity.ErrRateLimited, time.Hour},
		{"429 garbage", 429, hdr("Retry-After", "soon"), ``, capacity.ErrRateLimited, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t)
			w.srv.FailNext(http.MethodGet, "/v1/instances", c.status, c.header, c.body)
			err := w.Verify(context.Background())
			if err == nil {
				t.Fatal("no error")
			}
			if c.want == nil {
				if !capacity.Ambiguous(err) {
					t.Fatalf("got %v (code %q), want an uncoded, ambiguous error", err, capacity.CodeOf(err))
				}
			} else if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if d, _ := capacity.RetryAfter(err); d != c.retryAfter {
				t.Errorf("retry after %v, want %v", d, c.retryAfter)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("HTTP %d", c.status)) {
				t.Errorf("error %q does not name the status", err)
			}
		})
	}
}

// TestErrorsNeverContainTheKey drives a provider that echoes the key back in
// every error body and header it can, and checks no error, log line or
// printed configuration shows it.
func TestErrorsNeverContainTheKey(t *testing.T) {
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get("X-API-KEY")
		status := map[string]int{"/v1/instances": 401, "/v1/instances/types": 429, "/v1/instances/create": 409}[r.URL.Path]
		if status == 0 {
			status = 500
		}
		w.Header().Set("Retry-After", got)
		w.WriteHeader(status)
		_, _ = fmt.Fprintf(w, `{"error":"key %s rejected; out of stock for %s","message":"you sent X-API-KEY: %s\n%s"}`, got, got, got, strings.ToUpper(got))
	}))
	defer echo.Close()

	core, logs := observer.New(zapcore.DebugLevel)
	cfg := shadeform.Config{BaseURL: echo.URL + "/v1", APIKey: shadeform.NewAPIKey(testKey), Logger: zap.New(core)}
	p, err := shadeform.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cmd := capacity.ProvisionCommand{OperationKey: "op-1", RentalID: "r1", Generation: 1, OwnershipToken: "us", OfferID: "a/b/c"}
	ref := capacity.Ref{NativeRef: "i-1", OwnershipToken: "us"}
	var errs []error
	collect := func(_ any, err error) { errs = append(errs, err) }
	errs = append(errs, p.Verify(ctx))
	collect(p.ListCapacity(ctx, capacity.OfferQuery{}))
	collect(p.ProvisionCapacity(ctx, cmd))
	collect(p.ObserveCapacity(ctx, ref))
	collect(p.TerminateCapacity(ctx, capacity.Command{Ref: ref, Generation: 1}))
	collect(p.ListOwnedCapacity(ctx, capacity.OwnershipQuery{OwnershipToken: "us"}))
	echo.Close() // and now transport errors
	errs = append(errs, p.Verify(ctx))
	for i, err := range errs {
		if err == nil {
			t.Errorf("call %d succeeded against an erroring server", i)
			continue
		}
		if s := fmt.Sprintf("%v %+v %#v", err, err, err); strings.Contains(strings.ToLower(s), strings.ToLower(testKey)) {
			t.Errorf("call %d: error shows the key: %s", i, s)
		}
	}
	for _, e := range logs.All() {
		line, _ := json.Marshal(e.ContextMap())
		if strings.Contains(e.Message+string(line), testKey) {
			t.Errorf("log line shows the key: %s %s", e.Message, line)
		}
	}
	for _, s := range []string{fmt.Sprintf("%v", cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), fmt.Sprint(cfg.APIKey)} {
		if strings.Contains(s, testKey) {
			t.Errorf("printed config shows the key: %s", s)
		}
	}
	if b, _ := json.Marshal(struct{ Key shadeform.APIKey }{cfg.APIKey}); strings.Contains(string(b), testKey) {
		t.Errorf("JSON shows the key: %s", b)
	}
	core2, logs2 := observer.New(zapcore.DebugLevel)
	zap.New(core2).Info("config", zap.Any("key", cfg.APIKey), zap.Stringer("key2", cfg.APIKey))
	if line, _ := json.Marshal(logs2.All()[0].ContextMap()); strings.Contains(string(line), testKey) {
		t.Errorf("zap shows the key: %s", line)
	}
}

func TestRedirectOffHostNeverCarriesTheKey(t *testing.T) {
	leaked := make(chan string, 1)
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leaked <- r.Header.Get("X-API-KEY")
	}))
	defer elsewhere.Close()
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer redirector.Close()
	p, err := shadeform.New(shadeform.Config{BaseURL: redirector.URL + "/v1", APIKey: shadeform.NewAPIKey(testKey)})
	if err != nil {
		t.Fatal(err)
	}
	err = p.Verify(context.Background())
	if err == nil || strings.Contains(err.Error(), testKey) {
		t.Fatalf("Verify through an off-host redirect: %v", err)
	}
	select {
	case k := <-leaked:
		t.Fatalf("the redirect target received a request (key header %q)", k)
	default:
	}
}

func TestContextCancelsARequest(t *testing.T) {
	stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	defer stuck.Close()
	p, err := shadeform.New(shadeform.Config{BaseURL: stuck.URL, APIKey: shadeform.NewAPIKey(testKey)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = p.Verify(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("got %v after %v, want DeadlineExceeded promptly", err, time.Since(start))
	}
	if !capacity.Ambiguous(err) {
		t.Fatalf("a cancelled request must stay ambiguous: %v", err)
	}
}
