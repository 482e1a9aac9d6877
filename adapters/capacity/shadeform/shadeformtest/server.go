// Package shadeformtest is an in-process stand-in for Shadeform's API, for
// tests of the shadeform adapter and of anything built on it. It serves the
// documented request and response shapes under /v1 on an httptest.Server,
// keeps instances on a virtual clock, and can be told to fail: error
// bodies (out of stock, unauthorized, rate limited, not found) and lost
// responses.
//
// It shares no code with the adapter on purpose, so a shape the adapter
// gets wrong is a shape this server disagrees with.
package shadeformtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Server is a fake Shadeform API. Its clock starts at a fixed time and
// moves only with Advance.
type Server struct {
	*httptest.Server
	// BaseURL is the API root to give the adapter (URL + "/v1").
	BaseURL string

	key string

	mu        sync.Mutex
	now       time.Time
	activate  time.Duration
	deleteIn  time.Duration
	types     []InstanceType
	instances map[string]*Instance
	order     []string
	seq       int
	failures  []failure
	loseNext  int
	requests  []Request
}

// epoch is the server's starting time; Now reads the server's clock.
func epoch() time.Time { return time.Date(2030, time.March, 1, 12, 0, 0, 0, time.UTC) }

// Request is one request the server saw. It records whether the right key
// came with it, never the key.
type Request struct {
	Method, Path, Query string
	Authorized          bool
}

type failure struct {
	method, path string
	status       int
	header       http.Header
	body         string
}

// New starts a server accepting apiKey, closed when t ends. Instances go
// active one minute after creation and deleted 30 seconds after a delete.
func New(t testing.TB, apiKey string) *Server {
	s := &Server{key: apiKey, now: epoch(), activate: time.Minute, deleteIn: 30 * time.Second,
		types: DefaultTypes(), instances: map[string]*Instance{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/instances/types", s.handleTypes)
	mux.HandleFunc("GET /v1/instances", s.handleList)
	mux.HandleFunc("POST /v1/instances/create", s.handleCreate)
	mux.HandleFunc("GET /v1/instances/{id}/info", s.handleInfo)
	mux.HandleFunc("POST /v1/instances/{id}/delete", s.handleDelete)
	s.Server = httptest.NewServer(s.gate(mux))
	s.BaseURL = s.URL + "/v1"
	t.Cleanup(s.Close)
	return s
}

// gate records the request, checks the key, and serves queued failures.
func (s *Server) gate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		authorized := r.Header.Get("X-API-KEY") == s.key
		s.mu.Lock()
		s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Authorized: authorized})
		if !authorized {
			s.mu.Unlock()
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "Invalid API key"})
			return
		}
		var fail *failure
		for i, f := range s.failures {
			if f.method == r.Method && strings.HasPrefix(r.URL.Path, f.path) {
				fail = &f
				s.failures = slices.Delete(s.failures, i, i+1)
				break
			}
		}
		s.mu.Unlock()
		if fail != nil {
			for k, vs := range fail.header {
				for _, v := range vs {
					w.Header().Add(k, v)
				}
			}
			if fail.body != "" {
				w.Header().Set("Content-Type", "application/json")
			}
			w.WriteHeader(fail.status)
			_, _ = w.Write([]byte(fail.body))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// FailNext makes the next request with method and a path starting with
// pathPrefix (e.g. "/v1/instances/create") answer status, header and body
// instead of being served.
func (s *Server) FailNext(method, pathPrefix string, status int, header http.Header, body string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = append(s.failures, failure{method: method, path: pathPrefix, status: status, header: header, body: body})
}

// LoseNextCreates makes the next n creates take effect and then drop the
// connection before answering: the caller cannot know the instance exists.
func (s *Server) LoseNextCreates(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loseNext += n
}

// SetLatency sets how long instances take to go active and to be deleted.
func (s *Server) SetLatency(activate, deleteIn time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.activate, s.deleteIn = activate, deleteIn
}

// SetTypes replaces the instance-type catalogue.
func (s *Server) SetTypes(types []InstanceType) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.types = slices.Clone(types)
}

// Advance moves the server's clock.
func (s *Server) Advance(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = s.now.Add(d)
}

// Now is the server's clock.
func (s *Server) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now
}

// Requests returns every request seen so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// Instances returns every instance ever created or added, deleted ones
// included, in creation order.
func (s *Server) Instances() []Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Instance, 0, len(s.order))
	for _, id := range s.order {
		in := s.instances[id]
		in.settle(s.now)
		out = append(out, in.clone())
	}
	return out
}

// Instance returns one instance.
func (s *Server) Instance(id string) (Instance, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.instances[id]
	if in == nil {
		return Instance{}, false
	}
	in.settle(s.now)
	return in.clone(), true
}

// AddInstance creates an active instance directly (not through the API), as
// another user of the account would: for ownership tests.
func (s *Server) AddInstance(name string, tags ...string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := InstanceType{Cloud: "somecloud", Region: "someregion", ShadeInstanceType: "A100"}
	if len(s.types) > 0 {
		t = s.types[0]
	}
	in := s.newInstance(t.Cloud, t.Region, t, name, tags)
	in.Status, in.ActiveAt, in.IP = "active", s.now, fmt.Sprintf("203.0.113.%d", s.seq%250)
	return in.ID
}

func (s *Server) newInstance(cloud, region string, t InstanceType, name string, tags []string) *Instance {
	s.seq++
	in := &Instance{
		ID:                fmt.Sprintf("d290f1ee-6c54-4b01-90e6-%012d", s.seq),
		CloudAssignedID:   fmt.Sprintf("cloud-%d", s.seq),
		Cloud:             cloud,
		Region:            region,
		ShadeInstanceType: t.ShadeInstanceType,
		Configuration:     t.Configuration,
		HourlyPrice:       t.HourlyPrice,
		Name:              name,
		Tags:              slices.Clone(tags),
		Status:            "pending",
		CreatedAt:         s.now,
		activeDue:         s.now.Add(s.activate),
	}
	s.instances[in.ID] = in
	s.order = append(s.order, in.ID)
	return in
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
